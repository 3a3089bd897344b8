/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-train's ranks: whether this process is one of several started by an
 * MPI launcher (mpirun -np N zo-train ...), and the zo_comm over MPI its
 * partitioned engine (zo_part) uses. zo-train is built with MPI when meson
 * finds it (ZO_TRAIN_MPI); without, a multi-rank launch is refused with a
 * message instead of running N independent copies that would each train
 * the whole model and overwrite each other's output.
 *
 * Not part of the library: a tool helper.
 */
#ifndef ZO_TRAIN_DP_H
#define ZO_TRAIN_DP_H

#include <stddef.h>

#include <zoffload/part.h>

typedef struct train_dp {
    unsigned rank, world; /* world 1: a single process (no launcher, or -np 1) */
    int mpi;              /* MPI_Init was called here: train_dp_finish() finalizes */
    zo_comm comm;         /* world > 1: the collectives (comm_mpi.h) */
    void *impl;           /* the zo_comm_mpi behind comm */
} train_dp;

/* The world size an MPI launcher announced in the environment (Open MPI's
 * OMPI_COMM_WORLD_SIZE, PMIx's PMIX_SIZE... MPICH's PMI_SIZE), 1 if none. */
unsigned train_dp_launched_world(void);

/* Set up *d: a single process, or (launched with world > 1) MPI and the
 * comm, whose collectives give up after timeout_s seconds (0: never). @return 0; ZO_ENOTSUP (a multi-rank launch, zo-train built without
 * MPI); -EIO / -ENOMEM (MPI failed); the reason in why[len]. */
int train_dp_init(train_dp *d, int *argc, char ***argv, double timeout_s, char *why, size_t len);

/* Whether this zo-train can run ranks (was built with MPI). */
int train_dp_built(void);

/* The end of the run on every path: the comm freed, MPI finalized (after
 * the engine that used the comm is destroyed). */
void train_dp_finish(train_dp *d);

/* A rank that fails while the others go on would leave them waiting in
 * their next collective: end this process with exit status rc (the
 * launcher then ends the job). No-op in a single process. */
void train_dp_abort(train_dp *d, int rc);

/* Whether a collective timed out (a rank died, hangs or was stopped). */
int train_dp_timed_out(const train_dp *d);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo-train's ranks (train_dp.h): MPI only when the build has it and a
 * launcher started several ranks, so a plain zo-train never touches MPI.
 */
#include "train_dp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#ifdef ZO_TRAIN_MPI
#include <zoffload/comm_mpi.h>
#endif

unsigned train_dp_launched_world(void)
{
    /* the launchers zo-train is used with: Open MPI (OMPI_), PMIx, Hydra (PMI_) */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *e = getenv(vars[i]);
        char *end;
        unsigned long v = e ? strtoul(e, &end, 10) : 0;
        if (e && *e && !*end && v >= 1 && v <= 1u << 20)
            return (unsigned)v;
    }
    return 1;
}

int train_dp_built(void)
{
#ifdef ZO_TRAIN_MPI
    return 1;
#else
    return 0;
#endif
}

int train_dp_init(train_dp *d, int *argc, char ***argv, double timeout_s, char *why, size_t len)
{
    why[0] = 0;
    memset(d, 0, sizeof(*d));
    d->world = 1;
    zo_comm_default(&d->comm);
    unsigned world = train_dp_launched_world();
    if (world == 1)
        return 0;
#ifdef ZO_TRAIN_MPI
    if (MPI_Init(argc, argv) != MPI_SUCCESS)
    {
        snprintf(why, len, "MPI_Init failed");
        return -EIO;
    }
    d->mpi = 1;
    zo_comm_mpi *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(why, len, "out of memory");
        return -ENOMEM;
    }
    int r = zo_comm_mpi_init(&d->comm, m, MPI_COMM_WORLD);
    if (r < 0) {
        free(m);
        snprintf(why, len, "the MPI comm: %s", zo_strerror(r));
        return r;
    }
    m->timeout_s = timeout_s;
    d->impl = m;
    d->rank = d->comm.rank;
    d->world = d->comm.world;
    return 0;
#else
    (void)argc;
    (void)argv;
    (void)timeout_s;
    snprintf(why, len, "started as one of %u ranks (an MPI launcher), but this zo-train was built without MPI "
                       "(install libopenmpi-dev and reconfigure): each rank would train the whole model alone", world);
    return ZO_ENOTSUP;
#endif
}

void train_dp_finish(train_dp *d)
{
#ifdef ZO_TRAIN_MPI
    if (d->impl) {
        zo_comm_mpi_free(d->impl);
        free(d->impl);
        d->impl = NULL;
    }
    if (d->mpi)
        MPI_Finalize();
#endif
    d->mpi = 0;
}

int train_dp_timed_out(const train_dp *d)
{
#ifdef ZO_TRAIN_MPI
    return d->impl && ((const zo_comm_mpi *)d->impl)->timed_out;
#else
    (void)d;
    return 0;
#endif
}

void train_dp_abort(train_dp *d, int rc)
{
    if (d->mpi && d->world > 1) {
        /* Out without MPI_Finalize: the launcher sees a rank end with a
         * non-zero status and terminates the others, wherever they wait.
         * Not MPI_Abort: Open MPI 4.1's mpirun crashes now and then in its
         * PMIx log handler while reporting an abort (and more so when
         * ranks abort at once), and may leave the other ranks behind. */
        fflush(stdout);
        fflush(stderr);
        _exit(rc ? rc : 1);
    }
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zo_part, the partitioned engine of many ranks (include/zoffload/part.h),
 * on the host device backend with real processes and real collectives: the
 * ranks are forked processes, and the comm passed to them (the "external"
 * comm, as a framework passes its own) runs over POSIX shared memory mapped
 * before the fork, with a process-shared barrier. Every reduction adds the
 * ranks' values in rank order 0..world-1, so the results are the same bits
 * on every rank and can be compared bit for bit with a single-rank zo_optim
 * fed the averaged gradients (the sum in rank order divided by world in
 * fp32: what zo_part documents).
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#include "zo_test.h"
#include "zo_test_dtype.h"

#define NTHREADS 2
#define SGSIZE 65536u
#define MAXW 3

/* the model (as test_optim's): group 0 AdamW with decoupled decay, small
 * tensors packed and a large one cut across buckets and sub-groups; group
 * 1 Adam with L2 decay */
static const uint64_t g0_numel[] = {1000, 70000, 3, 130001};
static const uint64_t g1_numel[] = {4097, 51};
#define NT0 4
#define NT1 2
#define NT (NT0 + NT1)
static const char *const tnames[NT] = {"embed", "w1", "bias", "w2", "head", "norm"};

static uint64_t numel_of(int i)
{
    return i < NT0 ? g0_numel[i] : g1_numel[i - NT0];
}

static uint64_t off_of(int i)
{
    uint64_t o = 0;
    for (int k = 0; k < i; k++)
        o += numel_of(k);
    return o;
}

#define TOTAL (1000 + 70000 + 3 + 130001 + 4097 + 51)


static float init_param(uint64_t e)
{
    return (float)(0.5 * cos(0.001 * (double)e + 0.3));
}

/* rank r's gradient of element e in micro-step ms, from the params its
 * forward saw (so a wrong all-gather shows). Odd micro-steps are large
 * (clipped at max norm 1), even ones small. */
static float grad_value(uint64_t e, int ms, unsigned rank, float param_seen, int inf_ms, double scale)
{
    if (inf_ms > 0 && ms == inf_ms && rank == 1 && e == 5)
        return INFINITY;
    double amp = (ms % 2) ? 1e-2 : 1e-3;
    return (float)(scale * amp * (sin(0.003 * (double)e + 0.7 * ms + 1.3 * rank) + param_seen));
}

/* ---- the shared-memory comm --------------------------------------------------------- */

typedef struct shm {
    pthread_barrier_t bar;
    unsigned world;
    size_t slot;       /* bytes per rank */
    size_t res_bytes;  /* bytes of each rank's result area */
} shm;

typedef struct shm_rank {
    shm *h;
    unsigned rank;
    char *slots, *res;
} shm_rank;

static char *slot_of(shm_rank *c, unsigned r)
{
    return c->slots + (size_t)r * c->h->slot;
}

static int shm_wait(shm_rank *c)
{
    int r = pthread_barrier_wait(&c->h->bar);
    return r == 0 || r == PTHREAD_BARRIER_SERIAL_THREAD ? 0 : -r;
}

static float elem(const char *s, zo_dtype dt, uint64_t i)
{
    return zo_test_get(s, dt, i);
}

static int shm_reduce_scatter(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    shm_rank *c = user;
    unsigned w = c->h->world;
    size_t es = zo_dtype_size(dt);
    uint64_t total = 0, off = 0;
    for (unsigned r = 0; r < w; r++) {
        if (r < c->rank)
            off += counts[r];
        total += counts[r];
    }
    if (total * es > c->h->slot)
        return -E2BIG;
    memcpy(slot_of(c, c->rank), buf, total * es);
    int rc = shm_wait(c);
    if (rc)
        return rc;
    for (uint64_t i = off; i < off + counts[c->rank]; i++) {
        float acc = elem(slot_of(c, 0), dt, i); /* rank order, in fp32, one rounding to dt */
        for (unsigned r = 1; r < w; r++)
            acc += elem(slot_of(c, r), dt, i);
        zo_test_put(buf, dt, i, acc);
    }
    return shm_wait(c);
}

static int shm_all_gather(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    shm_rank *c = user;
    unsigned w = c->h->world;
    size_t es = zo_dtype_size(dt);
    uint64_t offs[MAXW + 1] = {0};
    for (unsigned r = 0; r < w; r++)
        offs[r + 1] = offs[r] + counts[r];
    if (offs[w] * es > c->h->slot)
        return -E2BIG;
    memcpy(slot_of(c, c->rank) + offs[c->rank] * es, (char *)buf + offs[c->rank] * es, counts[c->rank] * es);
    int rc = shm_wait(c);
    if (rc)
        return rc;
    for (unsigned r = 0; r < w; r++)
        if (r != c->rank)
            memcpy((char *)buf + offs[r] * es, slot_of(c, r) + offs[r] * es, counts[r] * es);
    return shm_wait(c);
}

static int shm_all_reduce(void *user, double *vals, unsigned n, int op)
{
    shm_rank *c = user;
    memcpy(slot_of(c, c->rank), vals, n * sizeof(double));
    int rc = shm_wait(c);
    if (rc)
        return rc;
    for (unsigned i = 0; i < n; i++) {
        double acc = ((double *)slot_of(c, 0))[i];
        for (unsigned r = 1; r < c->h->world; r++) {
            double v = ((double *)slot_of(c, r))[i];
            acc = op == ZO_COMM_SUM ? acc + v : (v > acc || isnan(v) ? v : acc);
        }
        vals[i] = acc;
    }
    return shm_wait(c);
}

/* A comm of the external kind: the caller's three callbacks. */
static void comm_fill(zo_comm *c, unsigned rank, unsigned world, void *user,
                      int (*rs)(void *, void *, const uint64_t *, zo_dtype),
                      int (*ag)(void *, void *, const uint64_t *, zo_dtype), int (*ar)(void *, double *, unsigned, int))
{
    zo_comm_default(c);
    c->rank = rank;
    c->world = world;
    c->user = user;
    c->reduce_scatter = rs;
    c->all_gather = ag;
    c->all_reduce = ar;
}

/* ---- the same comm, asynchronous: a comm thread per rank -------------------------------
 * Every collective (started, or called synchronously) goes to the rank's
 * comm thread, which runs them one at a time in the order given, over the
 * shared-memory comm above; wait() blocks until its one is done. The engine
 * then has a bucket filling while the previous one is being reduced. */

typedef struct aop {
    struct aop *next;
    int kind; /* 0 reduce-scatter, 1 all-gather, 2 all-reduce */
    void *buf;
    uint64_t counts[MAXW];
    zo_dtype dt;
    double *vals;
    unsigned n;
    int op, rc, done;
} aop;

typedef struct acomm {
    shm_rank *c;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    aop *head, *tail; /* not yet run, in order */
    int quit;
    unsigned inflight, max_inflight; /* started, not waited (the engine's view) */
} acomm;

static int g_async;              /* start_ranks: give the ranks the asynchronous comm */
static unsigned g_max_inflight;  /* in a rank: the most requests it had in flight */

static void *acomm_thread(void *arg)
{
    acomm *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->head && !a->quit)
            pthread_cond_wait(&a->cv, &a->mu);
        if (!a->head)
            break;
        aop *o = a->head;
        a->head = o->next;
        if (!a->head)
            a->tail = NULL;
        pthread_mutex_unlock(&a->mu);
        int rc = o->kind == 0   ? shm_reduce_scatter(a->c, o->buf, o->counts, o->dt)
                 : o->kind == 1 ? shm_all_gather(a->c, o->buf, o->counts, o->dt)
                                : shm_all_reduce(a->c, o->vals, o->n, o->op);
        pthread_mutex_lock(&a->mu);
        o->rc = rc;
        o->done = 1;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int acomm_start(acomm *a, aop *o, void **req)
{
    pthread_mutex_lock(&a->mu);
    if (a->tail)
        a->tail->next = o;
    else
        a->head = o;
    a->tail = o;
    a->inflight++;
    if (a->inflight > a->max_inflight)
        a->max_inflight = a->inflight;
    g_max_inflight = a->max_inflight;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    *req = o;
    return 0;
}

static int async_wait(void *user, void *req)
{
    acomm *a = user;
    aop *o = req;
    pthread_mutex_lock(&a->mu);
    while (!o->done)
        pthread_cond_wait(&a->cv, &a->mu);
    a->inflight--;
    pthread_mutex_unlock(&a->mu);
    int rc = o->rc;
    free(o);
    return rc;
}

static int async_coll_start(acomm *a, int kind, void *buf, const uint64_t *counts, zo_dtype dt, void **req)
{
    aop *o = calloc(1, sizeof(*o));
    if (!o)
        return -ENOMEM;
    o->kind = kind;
    o->buf = buf;
    memcpy(o->counts, counts, a->c->h->world * sizeof(uint64_t));
    o->dt = dt;
    return acomm_start(a, o, req);
}

static int async_rs_start(void *user, void *buf, const uint64_t *counts, zo_dtype dt, void **req)
{
    return async_coll_start(user, 0, buf, counts, dt, req);
}

static int async_ag_start(void *user, void *buf, const uint64_t *counts, zo_dtype dt, void **req)
{
    return async_coll_start(user, 1, buf, counts, dt, req);
}

static int async_rs(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    void *q;
    int r = async_rs_start(user, buf, counts, dt, &q);
    return r ? r : async_wait(user, q);
}

static int async_ag(void *user, void *buf, const uint64_t *counts, zo_dtype dt)
{
    void *q;
    int r = async_ag_start(user, buf, counts, dt, &q);
    return r ? r : async_wait(user, q);
}

static int async_ar(void *user, double *vals, unsigned n, int op)
{
    aop *o = calloc(1, sizeof(*o));
    if (!o)
        return -ENOMEM;
    o->kind = 2;
    o->vals = vals;
    o->n = n;
    o->op = op;
    void *q;
    acomm_start(user, o, &q);
    return async_wait(user, q);
}

/* ---- running ranks as processes ---------------------------------------------------- */

typedef struct rank_status {
    int rc;
    char msg[512];
} rank_status;

/* One rank's program: 0, or nonzero with a message in st->msg. */
typedef int (*rank_fn)(zo_comm *comm, char *res, void *arg, rank_status *st);

#define FAILR(st, ...)                                             \
    do {                                                           \
        snprintf((st)->msg, sizeof((st)->msg), __VA_ARGS__);       \
        return 1;                                                  \
    } while (0)

typedef struct run {
    shm *h;
    size_t bytes;
    char *slots, *res;
    rank_status *status;
} run;

/* Fork `world` ranks running fn over a fresh shared-memory comm; their
 * pids into pids[world]. The result areas (res_bytes each) stay readable
 * in *out until run_free(). */
static void start_ranks(run *out, unsigned world, size_t res_bytes, rank_fn fn, void *arg, pid_t *pids)
{
    size_t slot = (size_t)TOTAL * 4 + 4096;
    size_t bytes = 4096 + world * (slot + res_bytes + sizeof(rank_status)) + 4096;
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(mem, MAP_FAILED);
    shm *h = mem;
    h->world = world;
    h->slot = slot;
    h->res_bytes = res_bytes;
    pthread_barrierattr_t ba;
    pthread_barrierattr_init(&ba);
    pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
    ck_assert_int_eq(pthread_barrier_init(&h->bar, &ba, world), 0);
    pthread_barrierattr_destroy(&ba);
    out->h = h;
    out->bytes = bytes;
    out->slots = (char *)mem + 4096;
    out->res = out->slots + world * slot;
    out->status = (rank_status *)(out->res + world * res_bytes);
    for (unsigned r = 0; r < world; r++) {
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            alarm(240); /* a rank left waiting at a barrier must not hang the suite */
            shm_rank c = {.h = h, .rank = r, .slots = out->slots};
            zo_comm comm;
            acomm ac = {.c = &c};
            if (g_async) {
                pthread_mutex_init(&ac.mu, NULL);
                pthread_cond_init(&ac.cv, NULL);
                if (pthread_create(&ac.th, NULL, acomm_thread, &ac) != 0)
                    _exit(3);
                comm_fill(&comm, r, world, &ac, async_rs, async_ag, async_ar);
                comm.reduce_scatter_start = async_rs_start;
                comm.all_gather_start = async_ag_start;
                comm.wait = async_wait;
            } else {
                comm_fill(&comm, r, world, &c, shm_reduce_scatter, shm_all_gather, shm_all_reduce);
            }
            rank_status *st = &out->status[r];
            st->rc = fn(&comm, out->res + r * res_bytes, arg, st);
            if (g_async) {
                pthread_mutex_lock(&ac.mu);
                ac.quit = 1;
                pthread_cond_broadcast(&ac.cv);
                pthread_mutex_unlock(&ac.mu);
                pthread_join(ac.th, NULL);
            }
            _exit(st->rc ? 1 : 0);
        }
    }
}

/* Run fn on `world` forked ranks; every rank must return 0. */
static void run_ranks(run *out, unsigned world, size_t res_bytes, rank_fn fn, void *arg)
{
    pid_t pids[MAXW];
    start_ranks(out, world, res_bytes, fn, arg, pids);
    for (unsigned r = 0; r < world; r++) {
        int ws = 0;
        ck_assert_int_eq(waitpid(pids[r], &ws, 0), pids[r]);
        ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "rank %u of %u: %s (status 0x%x)", r, world,
                      out->status[r].msg[0] ? out->status[r].msg : "died", ws);
    }
}

static char *run_res(run *rn, unsigned r)
{
    return rn->res + r * rn->h->res_bytes;
}

/* After killed ranks: only unmap (glibc's pthread_barrier_destroy() waits
 * for the waiters to leave, and a killed rank never does). */
static void run_abandon(run *rn)
{
    munmap(rn->h, rn->bytes);
}

static void run_free(run *rn)
{
    pthread_barrier_destroy(&rn->h->bar);
    munmap(rn->h, rn->bytes);
}

/* ---- one configuration ------------------------------------------------------------- */

typedef struct pcase {
    unsigned world;
    zo_dtype pdt;
    zo_optim_placement place;
    unsigned accum;
    int steps;
    uint64_t bucket;
    int inf_ms; /* > 0: rank 1's gradient of element 5 (in rank 0's shard) is inf in this micro-step */
    int mixed;  /* rank 1 hands gradients over in forward order, and tensor 2 gets none in micro-step 1 */
    int async;  /* the asynchronous comm (start/wait callbacks, a comm thread per rank) */
    int dpu;    /* delayed parameter update (one warm-up boundary) */
    int bits;   /* state_bits of both groups: 0 (fp32 states), 8 or 4 */
} pcase;

/* Whether tensor i gets a gradient in micro-step ms. */
static int has_grad(const pcase *pc, int i, int ms)
{
    return !(pc->mixed && ms == 1 && i == 2);
}

/* A rank's (or the reference's) model: device params and gradients, the
 * engine template. */
typedef struct mdl {
    zo_dev *dev;
    zo_dtype pdt;
    void *dparam[NT];
    float *dgrad[NT];
    const char *names[NT];
    zo_optim_group grp[2];
    zo_cpuadam_hparams hp[2];
    zo_optim_config cfg;
} mdl;

static int mdl_init(mdl *m, const pcase *pc, const char *nvme)
{
    memset(m, 0, sizeof(*m));
    m->pdt = pc->pdt;
    if (zo_dev_open(&m->dev, NULL) < 0)
        return -1;
    size_t pes = zo_dtype_size(pc->pdt);
    for (int i = 0; i < NT; i++) {
        if (zo_dev_malloc(m->dev, &m->dparam[i], numel_of(i) * pes) < 0 ||
            zo_dev_malloc(m->dev, (void **)&m->dgrad[i], numel_of(i) * 4) < 0)
            return -1;
        for (uint64_t k = 0; k < numel_of(i); k++)
            zo_test_put(m->dparam[i], pc->pdt, k, init_param(off_of(i) + k));
        m->names[i] = tnames[i];
    }
    zo_cpuadam_hparams_default(&m->hp[0], ZO_OPTIM_ADAMW);
    m->hp[0].lr = 1e-2;
    m->hp[0].weight_decay = 0.1;
    zo_cpuadam_hparams_default(&m->hp[1], ZO_OPTIM_ADAM);
    m->hp[1].lr = 5e-3;
    m->hp[1].weight_decay = 1e-2;
    zo_optim_config_default(&m->cfg);
    m->cfg.dev = m->dev;
    m->cfg.param_dtype = pc->pdt;
    m->cfg.grad_dtype = ZO_DTYPE_F32;
    m->cfg.sub_group_size = SGSIZE;
    m->cfg.nthreads = NTHREADS;
    m->cfg.max_grad_norm = 1.0;
    m->cfg.grad_accum_steps = pc->accum;
    m->cfg.placement = pc->place;
    m->cfg.nvme_path = nvme;
    m->cfg.nonfinite = pc->inf_ms > 0 ? ZO_OPTIM_NONFINITE_SKIP : ZO_OPTIM_NONFINITE_ERROR;
    m->cfg.dpu = pc->dpu;
    m->cfg.dpu_warmup_steps = 1;
    for (int g = 0; g < 2; g++) {
        zo_optim_group_default(&m->grp[g]);
        m->grp[g].ntensors = g ? NT1 : NT0;
        m->grp[g].numel = g ? g1_numel : g0_numel;
        m->grp[g].names = m->names + (g ? NT0 : 0);
        m->grp[g].dev_params = m->dparam + (g ? NT0 : 0);
        m->grp[g].hparams = &m->hp[g];
        m->grp[g].state_bits = (uint16_t)pc->bits;
    }
    m->cfg.groups = m->grp;
    m->cfg.ngroups = 2;
    return 0;
}

static void mdl_free(mdl *m)
{
    for (int i = 0; i < NT; i++) {
        zo_dev_free(m->dev, m->dparam[i]);
        zo_dev_free(m->dev, m->dgrad[i]);
    }
    zo_dev_close(&m->dev);
}

/* Rank r's gradient of tensor i for micro-step ms, from the params it holds
 * now, times the loss scale (fp16). */
static void fill_grad(mdl *m, int i, int ms, unsigned rank, int inf_ms, double scale)
{
    for (uint64_t k = 0; k < numel_of(i); k++)
        m->dgrad[i][k] = grad_value(off_of(i) + k, ms, rank, zo_test_get(m->dparam[i], m->pdt, k), inf_ms, scale);
}

/* The result area of a rank. */
#define MAXSTEPS 8
typedef struct rank_res {
    zo_part_info info;
    double grad_norm[MAXSTEPS], clip_coef[MAXSTEPS], loss_scale[MAXSTEPS];
    int clipped[MAXSTEPS], skipped[MAXSTEPS];
    uint64_t single_state_bytes;
    unsigned max_inflight; /* the asynchronous comm: the most requests in flight at once */
    float params[TOTAL];
} rank_res;

typedef struct train_arg {
    const pcase *pc;
    const char *nvme;
    const char *ckroot; /* checkpoint test: save after `save_at` steps */
    int save_at;
    const char *name;   /* resharding: the checkpoint to load (NULL: the latest) */
    const char *resave; /* resharding: save it again at this world size under this root */
    int cont;           /* resharding: then train on to pc->steps */
} train_arg;

static void snapshot(mdl *m, float *out)
{
    for (int i = 0; i < NT; i++)
        for (uint64_t k = 0; k < numel_of(i); k++)
            out[off_of(i) + k] = zo_test_get(m->dparam[i], m->pdt, k);
}

static void record(rank_res *res, int s, const zo_optim_step_result *sr)
{
    res->grad_norm[s] = sr->grad_norm;
    res->clip_coef[s] = sr->clip_coef;
    res->clipped[s] = sr->clipped;
    res->skipped[s] = sr->skipped;
    res->loss_scale[s] = sr->loss_scale;
}

/* Train steps [from, to) on p; backward hands tensors over last to first. */
static int train(zo_part *p, mdl *m, unsigned rank, const pcase *pc, int from, int to, rank_res *res,
                 rank_status *st)
{
    for (int s = from; s < to; s++) {
        for (unsigned a = 0; a < pc->accum; a++) {
            int ms = s * (int)pc->accum + (int)a;
            double scale = zo_part_loss_scale(p);
            for (int k = 0; k < NT; k++) {
                int i = pc->mixed && rank == 1 ? k : NT - 1 - k;
                if (!has_grad(pc, i, ms))
                    continue;
                fill_grad(m, i, ms, rank, pc->inf_ms, scale);
                int r = zo_part_grad(p, (unsigned)i, m->dgrad[i], NULL);
                if (r)
                    FAILR(st, "rank %u grad %d: %s (%s)", rank, i, zo_strerror(r), zo_part_errmsg(p));
            }
            zo_optim_step_result sr = {.struct_size = sizeof(sr)};
            int r = zo_part_step(p, &sr);
            if (r)
                FAILR(st, "rank %u step %d: %s (%s)", rank, s, zo_strerror(r), zo_part_errmsg(p));
            if (sr.boundary != (a + 1 == pc->accum))
                FAILR(st, "rank %u step %d micro %u: boundary %d", rank, s, a, sr.boundary);
            if (sr.boundary && res && s < MAXSTEPS)
                record(res, s, &sr);
        }
    }
    return 0;
}

static int part_open(zo_part **p, mdl *m, zo_comm *comm, const pcase *pc, rank_status *st)
{
    zo_part_config pcfg;
    zo_part_config_default(&pcfg);
    pcfg.optim = &m->cfg;
    pcfg.comm = comm;
    pcfg.bucket_bytes = pc->bucket;
    int r = zo_part_create(p, &pcfg);
    if (r)
        FAILR(st, "rank %u create: %s (%s)", comm->rank, zo_strerror(r), zo_last_error_detail());
    return 0;
}

static int rank_train(zo_comm *comm, char *resb, void *argp, rank_status *st)
{
    train_arg *ta = argp;
    const pcase *pc = ta->pc;
    rank_res *res = (rank_res *)resb;
    mdl m;
    if (mdl_init(&m, pc, ta->nvme) < 0)
        FAILR(st, "rank %u: model", comm->rank);
    zo_part *p = NULL;
    if (part_open(&p, &m, comm, pc, st))
        return 1;
    int r = zo_part_init_from_device(p);
    if (r)
        FAILR(st, "rank %u init: %s (%s)", comm->rank, zo_strerror(r), zo_part_errmsg(p));
    if (train(p, &m, comm->rank, pc, 0, pc->steps, res, st))
        return 1;
    if ((r = zo_part_wait(p, NULL)) != 0) /* DPU: the last update, gathered */
        FAILR(st, "rank %u wait: %s (%s)", comm->rank, zo_strerror(r), zo_part_errmsg(p));
    res->info.struct_size = sizeof(res->info);
    if ((r = zo_part_get_info(p, &res->info)) != 0)
        FAILR(st, "info: %s", zo_strerror(r));
    /* the single-rank engine's state bytes, for the per-rank share */
    zo_optim_footprint f = {.struct_size = sizeof(f)};
    zo_optim_estimate(&m.cfg, 0, &f);
    res->single_state_bytes = f.host_state_bytes + f.nvme_state_bytes;
    res->max_inflight = g_max_inflight;
    snapshot(&m, res->params);
    zo_part_destroy(&p);
    mdl_free(&m);
    return 0;
}

/* The single-rank reference: zo_optim fed the averaged gradients (the sum
 * in rank order, divided by world in fp32), the same steps. */
static void reference(const pcase *pc, const char *nvme, int steps, rank_res *out)
{
    mdl m;
    ck_assert_int_eq(mdl_init(&m, pc, nvme), 0);
    zo_optim *o = NULL;
    int r = zo_optim_create(&o, &m.cfg);
    ck_assert_msg(r == 0, "reference create: %s (%s)", zo_strerror(r), zo_last_error_detail());
    ck_assert_int_eq(zo_optim_init_from_device(o), 0);
    float *tmp = malloc(130001 * 4);
    for (int s = 0; s < steps; s++) {
        for (unsigned a = 0; a < pc->accum; a++) {
            int ms = s * (int)pc->accum + (int)a;
            double scale = zo_optim_loss_scale(o);
            for (int i = NT - 1; i >= 0; i--) {
                for (uint64_t k = 0; k < numel_of(i); k++) {
                    float p = zo_test_get(m.dparam[i], m.pdt, k), acc = grad_value(off_of(i) + k, ms, 0, p, pc->inf_ms, scale);
                    for (unsigned rk = 1; rk < pc->world; rk++)
                        acc += grad_value(off_of(i) + k, ms, rk, p, pc->inf_ms, scale);
                    tmp[k] = acc;
                }
                for (uint64_t k = 0; k < numel_of(i); k++)
                    m.dgrad[i][k] = tmp[k] / (float)pc->world;
                if (has_grad(pc, i, ms))
                    ck_assert_int_eq(zo_optim_grad(o, (unsigned)i, m.dgrad[i], NULL), 0);
            }
            zo_optim_step_result sr = {.struct_size = sizeof(sr)};
            if (pc->dpu) {
                /* zo-train's DPU schedule: no wait once the delay is on */
                r = zo_optim_step_async(o, NULL);
                zo_optim_info oi = {.struct_size = sizeof(oi)};
                zo_optim_get_info(o, &oi);
                if (r == 0 && a + 1 == pc->accum) {
                    if (!oi.dpu_active) {
                        /* a warm-up boundary: step_async collected it; its result is the last */
                        if ((r = zo_optim_wait(o, &sr)) == 0)
                            zo_optim_last_result(o, &sr);
                    } else
                        zo_optim_last_result(o, &sr);
                    sr.boundary = 1;
                }
            } else {
                r = zo_optim_step(o, NULL, &sr);
            }
            ck_assert_msg(r == 0, "reference step: %s (%s)", zo_strerror(r), zo_optim_errmsg(o));
            if (sr.boundary && s < MAXSTEPS)
                record(out, s, &sr);
        }
    }
    free(tmp);
    ck_assert_int_eq(zo_optim_wait(o, NULL), 0); /* DPU: the last update */
    snapshot(&m, out->params);
    zo_optim_destroy(&o);
    mdl_free(&m);
}

static const pcase cases[] = {
    {2, ZO_DTYPE_F32, ZO_OPTIM_PLACE_HOST, 1, 5, 64 << 10},
    {3, ZO_DTYPE_BF16, ZO_OPTIM_PLACE_HOST, 2, 4, 64 << 10},
    {2, ZO_DTYPE_BF16, ZO_OPTIM_PLACE_NVME, 1, 4, 256 << 10},
    {3, ZO_DTYPE_F32, ZO_OPTIM_PLACE_NVME, 1, 4, 25 << 20},
    /* an inf in one rank's gradient, in another rank's shard: every rank
     * skips the step (bf16, ZO_OPTIM_NONFINITE_SKIP) */
    {2, ZO_DTYPE_BF16, ZO_OPTIM_PLACE_HOST, 1, 4, 64 << 10, 1},
    /* fp16 with the dynamic loss scaler: the skip and the scale agree */
    {3, ZO_DTYPE_F16, ZO_OPTIM_PLACE_HOST, 1, 5, 64 << 10, 2},
    /* the ranks' hooks fire in different orders, and a tensor gets no
     * gradient in one micro-step (zero, as a single rank's): buckets are
     * reduced in bucket order all the same */
    {2, ZO_DTYPE_F32, ZO_OPTIM_PLACE_HOST, 2, 3, 64 << 10, 0, 1},
    /* the asynchronous comm: two buckets in flight, the same bits */
    {2, ZO_DTYPE_BF16, ZO_OPTIM_PLACE_HOST, 2, 4, 64 << 10, 0, 0, 1},
    {3, ZO_DTYPE_F32, ZO_OPTIM_PLACE_NVME, 1, 4, 64 << 10, 0, 1, 1},
    {3, ZO_DTYPE_F16, ZO_OPTIM_PLACE_HOST, 1, 5, 64 << 10, 2, 0, 1},
    /* DPU per rank: the single-rank engine's delayed schedule (the forward
     * of step k sees the params of step k - 2), host and NVMe, with
     * accumulation, an overflow skip, either comm */
    {2, ZO_DTYPE_BF16, ZO_OPTIM_PLACE_HOST, 1, 5, 64 << 10, 0, 0, 1, 1},
    {3, ZO_DTYPE_F32, ZO_OPTIM_PLACE_NVME, 2, 4, 64 << 10, 0, 0, 0, 1},
    {2, ZO_DTYPE_F16, ZO_OPTIM_PLACE_HOST, 1, 5, 64 << 10, 3, 0, 1, 1},
};

/* World ranks, each feeding its own gradients, end with the parameters of a
 * single-rank engine fed the averaged gradients: bit for bit, clipping
 * (the global norm) and weight decay included; every rank the same. */
START_TEST(test_part_matches_single)
{
    const pcase *pc = &cases[_i];
    char dir[4096];
    zo_test_mkdtemp(dir, sizeof(dir));
    train_arg ta = {.pc = pc, .nvme = dir};
    run rn;
    g_async = pc->async;
    run_ranks(&rn, pc->world, sizeof(rank_res), rank_train, &ta);
    g_async = 0;
    rank_res *ref = calloc(1, sizeof(*ref));
    reference(pc, dir, pc->steps, ref);
    int nclipped = 0, nskipped = 0;
    double maxrel = 0;
    for (unsigned r = 0; r < pc->world; r++) {
        rank_res *rr = (rank_res *)run_res(&rn, r);
        for (int s = 0; s < pc->steps; s++) {
            ck_assert_msg(rr->skipped[s] == ref->skipped[s], "case %d rank %u step %d: skipped %d, single rank %d (norms "
                          "%.17g, %.17g; loss scales %g, %g)", _i, r, s, rr->skipped[s], ref->skipped[s],
                          rr->grad_norm[s], ref->grad_norm[s], rr->loss_scale[s], ref->loss_scale[s]);
            ck_assert_msg(rr->loss_scale[s] == ref->loss_scale[s], "case %d rank %u step %d: loss scale %g, %g", _i, r,
                          s, rr->loss_scale[s], ref->loss_scale[s]);
            nskipped += r == 0 && rr->skipped[s];
            if (rr->skipped[s]) {
                ck_assert(!isfinite(rr->grad_norm[s]) && !isfinite(ref->grad_norm[s]));
                continue;
            }
            /* the global norm: the ranks' partial sums of squares added in
             * rank order; the reference sums its sub-groups: the same up to
             * double rounding */
            ck_assert_msg(fabs(rr->grad_norm[s] - ref->grad_norm[s]) <= 1e-12 * ref->grad_norm[s],
                          "case %d rank %u step %d: norm %.17g, single rank %.17g", _i, r, s, rr->grad_norm[s],
                          ref->grad_norm[s]);
            ck_assert_int_eq(rr->clipped[s], ref->clipped[s]);
            ck_assert_msg((float)rr->clip_coef[s] == (float)ref->clip_coef[s],
                          "case %d rank %u step %d: clip coefficient %.17g, single rank %.17g", _i, r, s,
                          rr->clip_coef[s], ref->clip_coef[s]);
            nclipped += r == 0 && rr->clipped[s];
            maxrel = fmax(maxrel, fabs(rr->grad_norm[s] - ref->grad_norm[s]) / ref->grad_norm[s]);
        }
        for (uint64_t e = 0; e < TOTAL; e++)
            ZO_EXPECT(memcmp(&rr->params[e], &ref->params[e], 4) == 0,
                      "case %d rank %u element %llu: %a, single rank %a", _i, r, (unsigned long long)e,
                      (double)rr->params[e], (double)ref->params[e]);
        /* the buckets were reduced as backward handed them over */
        const zo_part_info *in = &rr->info;
        uint64_t micro = (uint64_t)pc->steps * pc->accum;
        ck_assert_uint_eq(in->reduce_scatters, in->nbuckets * micro);
        if (pc->mixed) /* rank 1's early tensors wait for the last ones */
            ck_assert_uint_lt(in->buckets_in_grad, in->nbuckets * micro);
        else
            ck_assert_uint_eq(in->buckets_in_grad, in->nbuckets * micro);
        unsigned skips = 0;
        for (int s = 0; s < pc->steps; s++)
            skips += (unsigned)rr->skipped[s];
        if (pc->dpu) /* init, the warm-up boundary unless skipped, every delayed boundary, the final wait */
            ck_assert_uint_eq(in->all_gathers, 2u * (1 + !rr->skipped[0] + (pc->steps - 1) + 1));
        else
            ck_assert_uint_eq(in->all_gathers, 2u * (pc->steps + 1 - skips)); /* none after a skipped step */
        if (pc->async) /* a bucket filled while the one before it moved */
            ck_assert_uint_ge(rr->max_inflight, 2);
        ck_assert_uint_eq(in->rank, r);
        ck_assert_uint_eq(in->world, pc->world);
        ck_assert_uint_eq(in->numel, TOTAL);
        ck_assert_int_eq(in->step, pc->steps - (int)skips);
        /* each rank holds its share of the states: 1/world of the single
         * engine's, up to the 4 KiB rounding of each sub-group's arrays
         * (host) or 1 MiB (NVMe swap extents) */
        uint64_t mine = in->state_host_bytes + in->state_nvme_bytes, share = rr->single_state_bytes / pc->world;
        uint64_t slack = (pc->place == ZO_OPTIM_PLACE_HOST ? 4096u : 1u << 20) * 3u * 8u;
        fprintf(stderr, "case %d rank %u/%u: %llu state bytes (%s), single rank %llu, share %llu; shard %llu of %llu "
                "elements; %u buckets\n", _i, r, pc->world, (unsigned long long)mine,
                pc->place == ZO_OPTIM_PLACE_HOST ? "host" : "nvme", (unsigned long long)rr->single_state_bytes,
                (unsigned long long)share, (unsigned long long)in->shard_numel, (unsigned long long)in->numel,
                in->nbuckets);
        ck_assert_msg(mine <= share + slack && mine + slack >= share, "rank %u: %llu state bytes, share %llu", r,
                      (unsigned long long)mine, (unsigned long long)share);
        if (pc->place == ZO_OPTIM_PLACE_HOST)
            ck_assert_msg(mine * 100 <= rr->single_state_bytes * 100 / pc->world + rr->single_state_bytes * 3,
                          "rank %u: %llu state bytes is not about 1/%u of %llu", r, (unsigned long long)mine,
                          pc->world, (unsigned long long)rr->single_state_bytes);
    }
    ck_assert_int_gt(nclipped, 0); /* clipping by the global norm was exercised */
    ck_assert_int_eq(nskipped, pc->inf_ms > 0);   /* and the global skip, where an inf was fed */
    fprintf(stderr, "case %d: global norm vs single rank: largest relative difference %.3g\n", _i, maxrel);
    free(ref);
    run_free(&rn);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- a comm that fails, and bad configurations (one process) ------------------------ */

typedef struct fake {
    int fail_rs, fail_ag, fail_ar;
} fake;

static int fake_rs(void *u, void *buf, const uint64_t *counts, zo_dtype dt)
{
    (void)buf, (void)counts, (void)dt;
    return ((fake *)u)->fail_rs;
}

static int fake_ag(void *u, void *buf, const uint64_t *counts, zo_dtype dt)
{
    (void)buf, (void)counts, (void)dt;
    return ((fake *)u)->fail_ag;
}

static int fake_ar(void *u, double *vals, unsigned n, int op)
{
    (void)vals, (void)n, (void)op;
    return ((fake *)u)->fail_ar;
}

static void fake_comm(zo_comm *c, fake *f, unsigned rank, unsigned world)
{
    comm_fill(c, rank, world, f, fake_rs, fake_ag, fake_ar);
}

/* A one-process engine configuration over a fake comm (not created). */
static void fake_setup(mdl *m, const pcase *pc, const char *nvme, fake *f, zo_comm *c, zo_part_config *pcfg)
{
    ck_assert_int_eq(mdl_init(m, pc, nvme), 0);
    memset(f, 0, sizeof(*f));
    fake_comm(c, f, 0, 2);
    zo_part_config_default(pcfg);
    pcfg->optim = &m->cfg;
    pcfg->comm = c;
    pcfg->bucket_bytes = 64 << 10;
}

static const pcase one = {2, ZO_DTYPE_F32, ZO_OPTIM_PLACE_HOST, 1, 1, 64 << 10};

static int hand_all(zo_part *p, mdl *m)
{
    for (int i = NT - 1; i >= 0; i--) {
        fill_grad(m, i, 1, 0, 0, 1.0);
        int r = zo_part_grad(p, (unsigned)i, m->dgrad[i], NULL);
        if (r)
            return r;
    }
    return 0;
}

START_TEST(test_part_comm_fails)
{
    mdl m;
    fake f;
    zo_comm c;
    zo_part_config pcfg;
    fake_setup(&m, &one, NULL, &f, &c, &pcfg);
    zo_part *p = NULL;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), 0);
    ck_assert_int_eq(zo_part_init_from_device(p), 0);
    ck_assert_int_eq(hand_all(p, &m), 0);
    ck_assert_int_eq(zo_part_step(p, NULL), 0);

    /* the all-reduce of the norm fails: the step fails with its error */
    f.fail_ar = -ETIMEDOUT;
    ck_assert_int_eq(hand_all(p, &m), 0);
    int r = zo_part_step(p, NULL);
    ck_assert_int_eq(r, -ETIMEDOUT);
    ck_assert_msg(strstr(zo_part_errmsg(p), "all_reduce") && strstr(zo_part_errmsg(p), "rank 0 of 2"), "%s",
                  zo_part_errmsg(p));
    /* out of step: refused until an init (or load) */
    f.fail_ar = 0;
    ck_assert_int_eq(zo_part_grad(p, 0, m.dgrad[0], NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_part_step(p, NULL), ZO_ESTATE);
    ck_assert_ptr_nonnull(strstr(zo_part_errmsg(p), "out of step"));
    ck_assert_int_eq(zo_part_save(p, "/nonexistent", "x", 0, NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_part_init_from_device(p), 0);
    ck_assert_int_eq(hand_all(p, &m), 0);
    ck_assert_int_eq(zo_part_step(p, NULL), 0);

    /* a reduce-scatter fails: the gradient that completed the bucket (the
     * last group's two tensors) fails */
    f.fail_rs = -EIO;
    ck_assert_int_eq(zo_part_grad(p, NT - 1, m.dgrad[NT - 1], NULL), 0);
    r = zo_part_grad(p, NT - 2, m.dgrad[NT - 2], NULL);
    ck_assert_int_eq(r, -EIO);
    ck_assert_ptr_nonnull(strstr(zo_part_errmsg(p), "reduce_scatter"));
    f.fail_rs = 0;
    ck_assert_int_eq(zo_part_step(p, NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_part_init_from_device(p), 0);

    /* the all-gather of the new params fails */
    f.fail_ag = -ECONNRESET;
    ck_assert_int_eq(hand_all(p, &m), 0);
    r = zo_part_step(p, NULL);
    ck_assert_int_eq(r, -ECONNRESET);
    ck_assert_ptr_nonnull(strstr(zo_part_errmsg(p), "all_gather"));
    /* and init, which gathers, fails with it too */
    ck_assert_int_eq(zo_part_init_from_device(p), -ECONNRESET);
    f.fail_ag = 0;
    ck_assert_int_eq(zo_part_init_from_device(p), 0);
    /* a positive return is not an error code: still a failure */
    f.fail_ar = 7;
    ck_assert_int_eq(hand_all(p, &m), 0);
    ck_assert_int_lt(zo_part_step(p, NULL), 0);
    f.fail_ar = 0;

    /* a tensor handed over twice in one micro-step */
    ck_assert_int_eq(zo_part_init_from_device(p), 0);
    ck_assert_int_eq(zo_part_grad(p, 2, m.dgrad[2], NULL), 0);
    ck_assert_int_eq(zo_part_grad(p, 2, m.dgrad[2], NULL), ZO_ESTATE);
    ck_assert_int_eq(zo_part_grad(p, NT, m.dgrad[2], NULL), -EINVAL);
    ck_assert_int_eq(zo_part_step(p, NULL), 0);
    zo_part_destroy(&p);
    ck_assert_ptr_null(p);
    zo_part_destroy(NULL);
    mdl_free(&m);
}
END_TEST

/* The framework moves its params (torch: module.to(), p.data = ...): after
 * zo_part_set_dev_param() the gathers land at the new addresses, never the
 * old ones, and the run goes on as one that never moved. */
START_TEST(test_part_move_params)
{
    mdl a, b;
    fake fa, fb;
    zo_comm ca, cb;
    zo_part_config pa, pb;
    fake_setup(&a, &one, NULL, &fa, &ca, &pa);
    fake_setup(&b, &one, NULL, &fb, &cb, &pb);
    zo_part *A = NULL, *B = NULL;
    ck_assert_int_eq(zo_part_create(&A, &pa), 0);
    ck_assert_int_eq(zo_part_create(&B, &pb), 0);
    ck_assert_int_eq(zo_part_init_from_device(A), 0);
    ck_assert_int_eq(zo_part_init_from_device(B), 0);
    size_t pes = zo_dtype_size(b.pdt);
    void *old[NT];
    for (int s = 0; s < 3; s++) {
        ck_assert_int_eq(hand_all(A, &a), 0);
        ck_assert_int_eq(hand_all(B, &b), 0);
        ck_assert_int_eq(zo_part_step(A, NULL), 0);
        ck_assert_int_eq(zo_part_step(B, NULL), 0);
        if (s == 0) {
            for (int i = 0; i < NT; i++) {
                size_t n = numel_of(i) * pes;
                void *nb = NULL;
                ck_assert_int_eq(zo_dev_malloc(b.dev, &nb, n), 0);
                memcpy(nb, b.dparam[i], n);
                ck_assert_int_eq(zo_part_set_dev_param(B, (unsigned)i, nb), 0);
                memset(b.dparam[i], 0xA5, n);
                old[i] = b.dparam[i];
                b.dparam[i] = nb;
            }
        }
        for (int i = 0; i < NT; i++)
            ck_assert_msg(memcmp(a.dparam[i], b.dparam[i], numel_of(i) * pes) == 0,
                          "step %d: tensor %d's params at the new address differ from the unmoved run's", s, i);
    }
    for (int i = 0; i < NT; i++) {
        const unsigned char *o = old[i];
        for (size_t j = 0; j < numel_of(i) * pes; j++)
            ck_assert_msg(o[j] == 0xA5, "tensor %d: the old address was written at byte %zu", i, j);
        zo_dev_free(b.dev, old[i]);
    }
    ck_assert_int_eq(zo_part_set_dev_param(NULL, 0, b.dparam[0]), -EINVAL);
    ck_assert_int_eq(zo_part_set_dev_param(B, NT, b.dparam[0]), -EINVAL);
    ck_assert_int_eq(zo_part_set_dev_param(B, 0, NULL), -EINVAL);
    zo_part_destroy(&A);
    zo_part_destroy(&B);
    mdl_free(&a);
    mdl_free(&b);
}
END_TEST

/* The asynchronous callbacks of a fake comm: requests are numbered in
 * start order; wait checks that order, counts, and fails where told. */
typedef struct afake {
    fake f;
    uintptr_t started, waited;
    uintptr_t fail_wait_at; /* the wait of this request (1-based) fails with -ETIMEDOUT; 0: none */
    int fail_start_ag;      /* all_gather_start returns this */
    int out_of_order;
} afake;

static int afake_rs_start(void *u, void *buf, const uint64_t *counts, zo_dtype dt, void **req)
{
    (void)buf, (void)counts, (void)dt;
    afake *a = u;
    *req = (void *)++a->started;
    return 0;
}

static int afake_ag_start(void *u, void *buf, const uint64_t *counts, zo_dtype dt, void **req)
{
    (void)buf, (void)counts, (void)dt;
    afake *a = u;
    if (a->fail_start_ag)
        return a->fail_start_ag;
    *req = (void *)++a->started;
    return 0;
}

static int afake_wait(void *u, void *req)
{
    afake *a = u;
    if ((uintptr_t)req != ++a->waited)
        a->out_of_order = 1;
    return a->waited == a->fail_wait_at ? -ETIMEDOUT : 0;
}

/* An asynchronous comm's failures: every started request is waited exactly
 * once, in order, whatever fails (a wait, a start, a destroy mid-window). */
START_TEST(test_part_async_comm_fails)
{
    mdl m;
    afake a;
    zo_comm c;
    zo_part_config pcfg;
    fake_setup(&m, &one, NULL, &a.f, &c, &pcfg);
    memset(&a, 0, sizeof(a));
    c.user = &a; /* fake's callbacks read a.f, the first member */
    c.reduce_scatter_start = afake_rs_start;
    c.all_gather_start = afake_ag_start;
    c.wait = afake_wait;
    zo_part *p = NULL;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), 0);
    zo_part_info in = {.struct_size = sizeof(in)};
    ck_assert_int_eq(zo_part_get_info(p, &in), 0);
    ck_assert_uint_gt(in.nbuckets, 3);
    ck_assert_int_eq(zo_part_init_from_device(p), 0);
    ck_assert_int_eq(hand_all(p, &m), 0);
    ck_assert_int_eq(zo_part_step(p, NULL), 0);
    ck_assert_uint_eq(a.started, a.waited);
    ck_assert_uint_ge(a.started, in.nbuckets + 2); /* the buckets and the two groups' gathers */

    /* the wait of the second bucket of a micro-step fails: that
     * zo_part_grad() fails naming it, and the bucket in flight is waited */
    a.fail_wait_at = a.waited + 2;
    int r = 0;
    for (int i = NT - 1; i >= 0 && r == 0; i--) {
        fill_grad(&m, i, 1, 0, 0, 1.0);
        r = zo_part_grad(p, (unsigned)i, m.dgrad[i], NULL);
    }
    ck_assert_int_eq(r, -ETIMEDOUT);
    ck_assert_msg(strstr(zo_part_errmsg(p), "wait") && strstr(zo_part_errmsg(p), "reduce_scatter"), "%s",
                  zo_part_errmsg(p));
    ck_assert_uint_eq(a.started, a.waited);
    ck_assert_int_eq(zo_part_step(p, NULL), ZO_ESTATE);
    a.fail_wait_at = 0;
    ck_assert_int_eq(zo_part_init_from_device(p), 0);

    /* a failing all_gather_start: nothing else is left in flight */
    ck_assert_int_eq(hand_all(p, &m), 0);
    a.fail_start_ag = -ENOMEM;
    ck_assert_int_eq(zo_part_step(p, NULL), -ENOMEM);
    ck_assert_ptr_nonnull(strstr(zo_part_errmsg(p), "all_gather_start"));
    ck_assert_uint_eq(a.started, a.waited);
    a.fail_start_ag = 0;
    ck_assert_int_eq(zo_part_init_from_device(p), 0);

    /* a gather's wait fails: the step fails, the other gather is waited */
    a.fail_wait_at = a.waited + in.nbuckets + 1; /* the buckets' waits, then the first gather's */
    ck_assert_int_eq(hand_all(p, &m), 0);
    ck_assert_int_eq(zo_part_step(p, NULL), -ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(zo_part_errmsg(p), "all_gather"));
    ck_assert_uint_eq(a.started, a.waited);
    a.fail_wait_at = 0;
    ck_assert_int_eq(zo_part_init_from_device(p), 0);

    /* destroyed with buckets in flight: they are waited */
    for (int i = NT - 1; i >= NT - 3; i--)
        ck_assert_int_eq(zo_part_grad(p, (unsigned)i, m.dgrad[i], NULL), 0);
    ck_assert_uint_gt(a.started, a.waited);
    zo_part_destroy(&p);
    ck_assert_uint_eq(a.started, a.waited);
    ck_assert_int_eq(a.out_of_order, 0);

    /* the three asynchronous callbacks come together */
    c.all_gather_start = NULL;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), ZO_ECONFIG);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "all_gather_start"));
    mdl_free(&m);
}
END_TEST

START_TEST(test_part_bad_config)
{
    mdl m;
    fake f;
    zo_comm c;
    zo_part_config pcfg;
    fake_setup(&m, &one, NULL, &f, &c, &pcfg);
    zo_part *p = (zo_part *)&pcfg; /* must be cleared on failure */
    struct {
        unsigned rank, world;
        int null_cb;
        int want;
        const char *what;
    } bad[] = {
        {0, 0, 0, ZO_ECONFIG, "world"},
        {2, 2, 0, ZO_ECONFIG, "rank"},
        {5, 3, 0, ZO_ECONFIG, "rank"},
        {0, 2, 1, ZO_ECONFIG, "reduce_scatter"},
        {1, 2, 2, ZO_ECONFIG, "all_gather"},
        {1, 2, 3, ZO_ECONFIG, "all_reduce"},
    };
    for (unsigned k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        fake_comm(&c, &f, bad[k].rank, bad[k].world);
        if (bad[k].null_cb == 1)
            c.reduce_scatter = NULL;
        if (bad[k].null_cb == 2)
            c.all_gather = NULL;
        if (bad[k].null_cb == 3)
            c.all_reduce = NULL;
        int r = zo_part_create(&p, &pcfg);
        ck_assert_msg(r == bad[k].want, "case %u: %s", k, zo_strerror(r));
        ck_assert_ptr_null(p);
        ck_assert_msg(strstr(zo_last_error_detail(), bad[k].what), "case %u: %s", k, zo_last_error_detail());
    }
    fake_comm(&c, &f, 0, 2);
    ck_assert_int_eq(zo_part_create(NULL, &pcfg), -EINVAL);
    ck_assert_int_eq(zo_part_create(&p, NULL), -EINVAL);
    pcfg.comm = NULL;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), -EINVAL);
    pcfg.comm = &c;
    c.struct_size = 3;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), -EINVAL);
    fake_comm(&c, &f, 0, 2);
    pcfg.bucket_bytes = 100;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), ZO_ECONFIG);
    pcfg.bucket_bytes = 64 << 10;
    /* what this version does not do is refused, never ignored */
    m.cfg.dpu = 1;
    m.cfg.dpu_double_buffer = 1;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), ZO_ENOTSUP);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "dpu_double_buffer"));
    m.cfg.dpu = m.cfg.dpu_double_buffer = 0;
    m.cfg.clip_mode = ZO_OPTIM_CLIP_SPECULATIVE;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), ZO_ENOTSUP);
    m.cfg.clip_mode = ZO_OPTIM_CLIP_TWO_PASS;
    m.cfg.no_grad = ZO_OPTIM_NO_GRAD_SKIP;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), ZO_ENOTSUP);
    m.cfg.no_grad = ZO_OPTIM_NO_GRAD_ZERO;
    m.grp[1].dev_params = NULL;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), ZO_ECONFIG);
    m.grp[1].dev_params = m.dparam + NT0;
    /* a model too small for the world: the last rank would own nothing */
    static const uint64_t tiny[] = {3};
    zo_optim_group tg;
    zo_optim_group_default(&tg);
    tg.ntensors = 1;
    tg.numel = tiny;
    tg.dev_params = m.dparam;
    m.cfg.groups = &tg;
    m.cfg.ngroups = 1;
    fake_comm(&c, &f, 0, 3);
    ck_assert_int_eq(zo_part_create(&p, &pcfg), ZO_ECONFIG);
    ck_assert_ptr_nonnull(strstr(zo_last_error_detail(), "too small"));
    /* 3 elements over 2 ranks: shards of 2 and 1 */
    fake_comm(&c, &f, 1, 2);
    ck_assert_int_eq(zo_part_create(&p, &pcfg), 0);
    zo_part_info in = {.struct_size = sizeof(in)};
    ck_assert_int_eq(zo_part_get_info(p, &in), 0);
    ck_assert_uint_eq(in.shard_numel, 1);
    in.struct_size = 8;
    ck_assert_int_eq(zo_part_get_info(p, &in), -EINVAL);
    zo_part_destroy(&p);
    mdl_free(&m);
}
END_TEST

/* The code maps of quantized states (zo_optim_config.state_map_m / _v):
 * checked on the whole model (refused where no group would use them), and
 * reaching every rank's quantized groups; a rank that owns no shard of the
 * quantized group still creates (its engine would refuse maps it does not
 * use), while its neighbours' engines take them. */
START_TEST(test_part_state_maps)
{
    mdl m;
    fake f;
    zo_comm c;
    zo_part_config pcfg;
    fake_setup(&m, &one, NULL, &f, &c, &pcfg);
    zo_part *p = NULL;
    m.cfg.state_map_m = ZO_QMAP_LINEAR_SIGNED; /* no group has state_bits */
    ck_assert_int_eq(zo_part_create(&p, &pcfg), ZO_ECONFIG);
    ck_assert_msg(strstr(zo_last_error_detail(), "zo_part_create: state_map_m 2 is set but no group"), "%s",
                  zo_last_error_detail());
    m.grp[0].state_bits = m.grp[1].state_bits = 8;
    m.cfg.state_map_v = ZO_QMAP_LINEAR_SIGNED;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), ZO_ECONFIG);
    ck_assert_msg(strstr(zo_last_error_detail(), "state_map_v 2: v is unsigned"), "%s", zo_last_error_detail());
    ck_assert_ptr_null(p);
    /* group 0: q8, 2 elements (shards are even: at 3 ranks rank 0 owns both, ranks 1 and 2 none);
     * group 1: fp32 states */
    static const uint64_t two[] = {2}, rest[] = {3001};
    zo_optim_group tg[2];
    for (int g = 0; g < 2; g++) {
        zo_optim_group_default(&tg[g]);
        tg[g].ntensors = 1;
        tg[g].numel = g ? rest : two;
        tg[g].dev_params = m.dparam + g;
    }
    tg[0].state_bits = 8;
    m.cfg.groups = tg;
    m.cfg.ngroups = 2;
    m.cfg.state_map_v = ZO_QMAP_LINEAR_UNSIGNED_NZ;
    for (unsigned r = 0; r < 3; r++) {
        fake_comm(&c, &f, r, 3);
        int rc = zo_part_create(&p, &pcfg);
        ck_assert_msg(rc == 0, "rank %u: %s (%s)", r, zo_strerror(rc), zo_last_error_detail());
        zo_optim_info info = {.struct_size = sizeof(info)};
        ck_assert_int_eq(zo_optim_get_info(zo_part_optim(p), &info), 0);
        unsigned nq = 0;
        for (unsigned k = 0; k < info.nsubgroups; k++) {
            zo_optim_qstate_info qi = {.struct_size = sizeof(qi)};
            ck_assert_int_eq(zo_optim_get_qstate_info(zo_part_optim(p), k, &qi), 0);
            if (!qi.bits)
                continue;
            nq++;
            ck_assert_int_eq(qi.map[ZO_OPTIM_STATE_EXP_AVG], ZO_QMAP_LINEAR_SIGNED);
            ck_assert_int_eq(qi.map[ZO_OPTIM_STATE_EXP_AVG_SQ], ZO_QMAP_LINEAR_UNSIGNED_NZ);
        }
        ck_assert_msg(nq == (r == 0), "rank %u: %u quantized sub-groups", r, nq); /* its shard of group 0, if any */
        zo_part_destroy(&p);
    }
    mdl_free(&m);
}
END_TEST

/* ---- checkpoints -------------------------------------------------------------------- */

/* Train save_at steps, save, train to `steps` (params A); then a new
 * engine loads the checkpoint and trains the same steps (params B = A). */
static int rank_ckpt(zo_comm *comm, char *resb, void *argp, rank_status *st)
{
    train_arg *ta = argp;
    const pcase *pc = ta->pc;
    float *a = (float *)resb;
    mdl m;
    if (mdl_init(&m, pc, ta->nvme) < 0)
        FAILR(st, "model");
    zo_part *p = NULL;
    if (part_open(&p, &m, comm, pc, st))
        return 1;
    int r = zo_part_init_from_device(p);
    if (r)
        FAILR(st, "init: %s", zo_strerror(r));
    if (train(p, &m, comm->rank, pc, 0, ta->save_at, NULL, st))
        return 1;
    if ((r = zo_part_save(p, ta->ckroot, "ck1", 2, "{\"epoch\": 3}")) != 0)
        FAILR(st, "rank %u save: %s (%s)", comm->rank, zo_strerror(r), zo_part_errmsg(p));
    if (train(p, &m, comm->rank, pc, ta->save_at, pc->steps, NULL, st))
        return 1;
    snapshot(&m, a);
    zo_part_destroy(&p);
    mdl_free(&m);
    /* a fresh engine from the initial params, resumed from the checkpoint */
    if (mdl_init(&m, pc, ta->nvme) < 0 || part_open(&p, &m, comm, pc, st))
        FAILR(st, "reopen");
    char uj[64];
    if ((r = zo_part_load(p, ta->ckroot, "ck1", uj, sizeof(uj))) != 0)
        FAILR(st, "rank %u load: %s (%s)", comm->rank, zo_strerror(r), zo_part_errmsg(p));
    if (!strstr(uj, "\"epoch\"") || !strstr(uj, "3"))
        FAILR(st, "rank %u: user json back: '%s'", comm->rank, uj);
    if (train(p, &m, comm->rank, pc, ta->save_at, pc->steps, NULL, st))
        return 1;
    float *b = malloc((size_t)TOTAL * 4);
    snapshot(&m, b);
    for (uint64_t e = 0; e < TOTAL; e++)
        if (memcmp(&a[e], &b[e], 4))
            FAILR(st, "rank %u element %llu: resumed %a, uninterrupted %a", comm->rank, (unsigned long long)e,
                  (double)b[e], (double)a[e]);
    free(b);
    zo_part_info in = {.struct_size = sizeof(in)};
    zo_part_get_info(p, &in);
    if (in.step != pc->steps)
        FAILR(st, "rank %u: step %lld after resume", comm->rank, (long long)in.step);
    zo_part_destroy(&p);
    mdl_free(&m);
    return 0;
}

/* A resharded load: checkpoint ta->name of ta->ckroot (saved by another
 * number of ranks, or the same) loaded by this world; the params right
 * after the load into res; then saved again (ta->resave) or trained on
 * (ta->cont: the params after the last step into res). */
static int rank_reshard(zo_comm *comm, char *resb, void *argp, rank_status *st)
{
    train_arg *ta = argp;
    const pcase *pc = ta->pc;
    mdl m;
    zo_part *p = NULL;
    if (mdl_init(&m, pc, ta->nvme) < 0 || part_open(&p, &m, comm, pc, st))
        FAILR(st, "rank %u: open", comm->rank);
    char uj[64];
    int r = zo_part_load(p, ta->ckroot, ta->name, uj, sizeof(uj));
    if (r)
        FAILR(st, "rank %u of %u: load %s: %s (%s)", comm->rank, comm->world, ta->ckroot, zo_strerror(r),
              zo_part_errmsg(p));
    if (!strstr(uj, "\"epoch\""))
        FAILR(st, "rank %u: user json back: '%s'", comm->rank, uj);
    zo_part_info in = {.struct_size = sizeof(in)};
    zo_part_get_info(p, &in);
    if (in.step != ta->save_at)
        FAILR(st, "rank %u of %u: step %lld after the load, saved at %d", comm->rank, comm->world,
              (long long)in.step, ta->save_at);
    snapshot(&m, (float *)resb);
    if (ta->resave && (r = zo_part_save(p, ta->resave, "ck2", 2, "{\"epoch\": 4}")) != 0)
        FAILR(st, "rank %u of %u: save: %s (%s)", comm->rank, comm->world, zo_strerror(r), zo_part_errmsg(p));
    if (ta->cont) {
        if (train(p, &m, comm->rank, pc, ta->save_at, pc->steps, NULL, st))
            return 1;
        snapshot(&m, (float *)resb);
    }
    zo_part_destroy(&p);
    mdl_free(&m);
    return 0;
}

START_TEST(test_part_checkpoint)
{
    const pcase pc = {2, ZO_DTYPE_BF16, _i ? ZO_OPTIM_PLACE_NVME : ZO_OPTIM_PLACE_HOST, 1, 4, 64 << 10};
    char dir[4096], ck[4200];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(ck, sizeof(ck), "%s/ck", dir);
    train_arg ta = {.pc = &pc, .nvme = dir, .ckroot = ck, .save_at = 2};
    run rn;
    run_ranks(&rn, 2, (size_t)TOTAL * 4, rank_ckpt, &ta);
    float *a0 = (float *)run_res(&rn, 0), *a1 = (float *)run_res(&rn, 1);
    ck_assert_int_eq(memcmp(a0, a1, (size_t)TOTAL * 4), 0); /* the ranks agree */

    /* Resharding: the 2-rank checkpoint loaded by 1 and by 3 ranks gives the
     * same params as a 2-rank load; saved again there and loaded back by 2
     * ranks, training on gives the uninterrupted run's params bit for bit
     * (masters, both moments, step, loss scaler and learning rate all went
     * through the other world size unchanged). */
    run same;
    train_arg la = ta;
    la.name = "ck1";
    run_ranks(&same, 2, (size_t)TOTAL * 4, rank_reshard, &la);
    for (unsigned w = 1; w <= 3; w += 2) {
        char ck2[4300];
        snprintf(ck2, sizeof(ck2), "%s/ck-at-%u", dir, w);
        train_arg ra = la;
        ra.name = NULL; /* the latest */
        ra.resave = ck2;
        run there;
        run_ranks(&there, w, (size_t)TOTAL * 4, rank_reshard, &ra);
        for (unsigned r = 0; r < w; r++)
            ck_assert_msg(memcmp(run_res(&there, r), run_res(&same, 0), (size_t)TOTAL * 4) == 0,
                          "rank %u of %u: the params after a resharded load differ from a 2-rank load's", r, w);
        run_free(&there);
        train_arg ba = ta;
        ba.ckroot = ck2;
        ba.name = "ck2";
        ba.cont = 1;
        run back;
        run_ranks(&back, 2, (size_t)TOTAL * 4, rank_reshard, &ba);
        for (unsigned r = 0; r < 2; r++)
            ck_assert_msg(memcmp(run_res(&back, r), a0, (size_t)TOTAL * 4) == 0,
                          "2 -> %u -> 2 ranks, rank %u: training on differs from the uninterrupted run", w, r);
        run_free(&back);
    }
    run_free(&same);

    /* a checkpoint that is not there */
    mdl m;
    fake f;
    zo_comm c;
    zo_part_config pcfg;
    fake_setup(&m, &pc, dir, &f, &c, &pcfg);
    fake_comm(&c, &f, 0, 3);
    zo_part *p0 = NULL;
    ck_assert_int_eq(zo_part_create(&p0, &pcfg), 0);
    ck_assert_int_eq(zo_part_load(p0, ck, "nope", NULL, 0), -ENOENT);
    zo_part_destroy(&p0);
    /* another model at the same world size */
    m.hp[0].lr = 1e-2;
    static const uint64_t other[] = {1000, 70000, 3, 130002};
    m.grp[0].numel = other;
    fake_comm(&c, &f, 1, 2);
    zo_part *p = NULL;
    float *big = malloc(130002 * 4);
    void *saved = m.dparam[3];
    m.dparam[3] = big;
    ck_assert_int_eq(zo_part_create(&p, &pcfg), 0);
    int r = zo_part_load(p, ck, "ck1", NULL, 0);
    ck_assert_msg(r == ZO_EFORMAT && strstr(zo_part_errmsg(p), "another model"), "%s (%s)", zo_strerror(r),
                  zo_part_errmsg(p));
    zo_part_destroy(&p);
    m.dparam[3] = saved;
    free(big);
    mdl_free(&m);
    run_free(&rn);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- the world commit under kill -9 ---------------------------------------------- */

/* A rank's model and engine for ta's case. */
static int rank_open(mdl *m, zo_part **p, zo_comm *comm, const train_arg *ta, rank_status *st)
{
    if (mdl_init(m, ta->pc, ta->nvme) < 0 || part_open(p, m, comm, ta->pc, st))
        FAILR(st, "rank %u of %u: open", comm->rank, comm->world);
    return 0;
}

/* Train and save after every step ("s<k>", keep_last 2) until killed; the
 * last committed step into res. */
static int rank_save_loop(zo_comm *comm, char *resb, void *argp, rank_status *st)
{
    train_arg *ta = argp;
    mdl m;
    zo_part *p = NULL;
    if (rank_open(&m, &p, comm, ta, st))
        return 1;
    int r = zo_part_init_from_device(p);
    if (r)
        FAILR(st, "init: %s", zo_strerror(r));
    for (int k = 1;; k++) {
        if (train(p, &m, comm->rank, ta->pc, k - 1, k, NULL, st))
            return 1;
        char nm[32];
        snprintf(nm, sizeof(nm), "s%d", k);
        if (comm->rank == 1)
            usleep(30000); /* rank 1 saves late: rank 0 has its shard long before the world has */
        if ((r = zo_part_save(p, ta->ckroot, nm, 2, "{\"epoch\": 1}")) != 0)
            FAILR(st, "rank %u save %s: %s (%s)", comm->rank, nm, zo_strerror(r), zo_part_errmsg(p));
        *(volatile int *)resb = k;
    }
}

/* Load the world's latest; its step into res. */
static int rank_load_latest(zo_comm *comm, char *resb, void *argp, rank_status *st)
{
    train_arg *ta = argp;
    mdl m;
    zo_part *p = NULL;
    if (rank_open(&m, &p, comm, ta, st))
        return 1;
    int r = zo_part_load(p, ta->ckroot, NULL, NULL, 0);
    if (r)
        FAILR(st, "rank %u: loading the latest of %s: %s (%s)", comm->rank, ta->ckroot, zo_strerror(r),
              zo_part_errmsg(p));
    zo_part_info in = {.struct_size = sizeof(in)};
    zo_part_get_info(p, &in);
    *(int *)resb = (int)in.step;
    zo_part_destroy(&p);
    mdl_free(&m);
    return 0;
}

/* Two ranks save after every step; one of them, then the other, is killed
 * (SIGKILL) at a random moment after the first commit, 16 times over. Each time the world's
 * latest checkpoint (world.json) must load on both ranks, at the step its
 * name says, at least the last step a rank saw committed. */
START_TEST(test_part_commit_crash)
{
    const pcase pc = {2, ZO_DTYPE_F32, ZO_OPTIM_PLACE_HOST, 1, 1 << 30, 64 << 10};
    char dir[4096];
    zo_test_mkdtemp(dir, sizeof(dir));
    unsigned seed = 12345;
    int loaded_rounds = 0;
    for (int round = 0; round < 16; round++) {
        char ck[4200];
        snprintf(ck, sizeof(ck), "%s/ck%d", dir, round);
        train_arg ta = {.pc = &pc, .nvme = dir, .ckroot = ck};
        run rn;
        pid_t pids[2];
        start_ranks(&rn, 2, 64, rank_save_loop, &ta, pids);
        seed = seed * 1103515245u + 12345u;
        /* past the first commit (however slow the machine), then a moment
         * anywhere in the next few steps and saves */
        for (int w = 0; w < 2000 && *(volatile int *)run_res(&rn, 1) < 1; w++)
            usleep(10000);
        usleep((seed >> 8) % 150000);
        unsigned victim = (seed >> 4) & 1;
        kill(pids[victim], SIGKILL);
        usleep((seed >> 12) % 3000);
        kill(pids[1 - victim], SIGKILL);
        for (int r = 0; r < 2; r++) {
            int ws;
            ck_assert_int_eq(waitpid(pids[r], &ws, 0), pids[r]);
            ck_assert_msg(WIFSIGNALED(ws), "round %d rank %d ended by itself: %s", round, r, rn.status[r].msg);
        }
        int s0 = *(int *)run_res(&rn, 0), s1 = *(int *)run_res(&rn, 1);
        int seen = s0 < s1 ? s0 : s1; /* both returned from save s<seen> */
        run_abandon(&rn);
        char path[4300], js[256] = "";
        snprintf(path, sizeof(path), "%s/world.json", ck);
        FILE *f = fopen(path, "r");
        if (!f) {
            ck_assert_msg(seen == 0, "round %d: no world.json, but s%d was committed", round, seen);
            continue; /* killed before the first commit */
        }
        ck_assert_ptr_nonnull(fgets(js, sizeof(js), f));
        fclose(f);
        int named = 0;
        ck_assert_msg(sscanf(js, "{\"name\":\"s%d\"", &named) == 1, "round %d: %s", round, js);
        ck_assert_msg(named >= seen, "round %d: world.json names s%d, but s%d was committed", round, named, seen);
        run lr;
        run_ranks(&lr, 2, 64, rank_load_latest, &ta);
        for (int r = 0; r < 2; r++)
            ck_assert_msg(*(int *)run_res(&lr, (unsigned)r) == named, "round %d rank %d: loaded step %d, world.json "
                          "names s%d", round, r, *(int *)run_res(&lr, (unsigned)r), named);
        run_free(&lr);
        loaded_rounds++;
    }
    ck_assert_msg(loaded_rounds == 16, "only %d of 16 rounds got past the first commit", loaded_rounds);
    zo_test_rmtree(dir);
}
END_TEST

/* ---- resharding quantized states ----------------------------------------------------- */

/* The result area of a quantized-resharding rank: its shard's three states
 * exported as fp32 at their global element positions (0 elsewhere), then
 * the params after training on. */
typedef struct qres {
    float st[ZO_OPTIM_STATE_COUNT][TOTAL];
    float params[TOTAL];
} qres;

static const uint64_t qgroup_numel[2] = {1000 + 70000 + 3 + 130001, 4097 + 51};

/* Rank r of w's shard of group g (include/zoffload/part.h): [*lo, *lo + *n). */
static void shard_of(unsigned g, unsigned r, unsigned w, uint64_t *lo, uint64_t *n)
{
    uint64_t N = qgroup_numel[g], S = (N + w - 1) / w;
    S += S & 1;
    *lo = r * S < N ? r * S : N;
    *n = ((r + 1) * S < N ? (r + 1) * S : N) - *lo;
}

/* This rank's states through the public export, as fp32, into q->st. */
static int export_states(zo_part *p, const zo_comm *comm, qres *q, rank_status *st)
{
    memset(q->st, 0, sizeof(q->st));
    unsigned inner = 0;
    for (unsigned g = 0; g < 2; g++) {
        uint64_t lo, n, gbase = g ? qgroup_numel[0] : 0;
        shard_of(g, comm->rank, comm->world, &lo, &n);
        if (!n)
            continue;
        for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++) {
            int r = zo_optim_state_export(zo_part_optim(p), inner, (zo_optim_state)k, q->st[k] + gbase + lo,
                                          ZO_DTYPE_F32, 0, n);
            if (r)
                FAILR(st, "rank %u of %u: export group %u state %d: %s (%s)", comm->rank, comm->world, g, k,
                      zo_strerror(r), zo_optim_errmsg(zo_part_optim(p)));
        }
        inner++;
    }
    return 0;
}

/* ta->name NULL: a fresh run to ta->save_at, saved as "ck1" under
 * ta->ckroot; else checkpoint ta->name of ta->ckroot loaded (saved by
 * another world size) and saved again as "ck2" under ta->resave (if
 * given). Then the states exported, training on to pc->steps, the params. */
static int rank_qrun(zo_comm *comm, char *resb, void *argp, rank_status *st)
{
    train_arg *ta = argp;
    qres *q = (qres *)resb;
    mdl m;
    zo_part *p = NULL;
    if (rank_open(&m, &p, comm, ta, st))
        return 1;
    int r = ta->name ? zo_part_load(p, ta->ckroot, ta->name, NULL, 0) : zo_part_init_from_device(p);
    if (r)
        FAILR(st, "rank %u of %u: %s: %s (%s)", comm->rank, comm->world, ta->name ? "load" : "init", zo_strerror(r),
              zo_part_errmsg(p));
    if (!ta->name && train(p, &m, comm->rank, ta->pc, 0, ta->save_at, NULL, st))
        return 1;
    const char *root = ta->name ? ta->resave : ta->ckroot;
    if (root && (r = zo_part_save(p, root, ta->name ? "ck2" : "ck1", 2, "{\"epoch\": 3}")) != 0)
        FAILR(st, "rank %u of %u: save: %s (%s)", comm->rank, comm->world, zo_strerror(r), zo_part_errmsg(p));
    if (export_states(p, comm, q, st) || train(p, &m, comm->rank, ta->pc, ta->save_at, ta->pc->steps, NULL, st))
        return 1;
    snapshot(&m, q->params);
    zo_part_destroy(&p);
    mdl_free(&m);
    return 0;
}

/* What the load must give for state k of one new sub-group from the old
 * fp32 values x[n]: x itself (masters, fp32 states), or the new layout's
 * quantize-then-dequantize of its blocks (from the sub-group's start). */
static void expect_sg(const float *x, uint64_t n, int k, int bits, float *out)
{
    if (k == ZO_OPTIM_STATE_MASTER || !bits) {
        memcpy(out, x, n * 4);
        return;
    }
    size_t B = bits == 4 ? 128 : 256;
    zo_qmap map = k == ZO_OPTIM_STATE_EXP_AVG ? ZO_QMAP_DYNAMIC_SIGNED
                  : bits == 4                 ? ZO_QMAP_DYNAMIC_UNSIGNED_NZ
                                              : ZO_QMAP_DYNAMIC_UNSIGNED;
    uint8_t *codes = malloc(n);
    float *sc = malloc((n / B + 1) * 4);
    ck_assert(codes && sc);
    ck_assert_int_eq(zo_cpuadam_quantize(x, n, map, bits, B, codes, sc), 0);
    ck_assert_int_eq(zo_cpuadam_dequantize(codes, sc, n, map, bits, B, out), 0);
    free(codes);
    free(sc);
}

/* Saved at 2 ranks with state_bits sb, loaded at 1 and at 3 with lb (0:
 * fp32 states). The states after the load: bit for bit the old run's
 * exported fp32 states (every old rank's, concatenated) put through the
 * new layout's quantization (sub-groups of SGSIZE from each new shard's
 * start, blocks from each sub-group's start); masters bit for bit. A load
 * that imported a new block in pieces from two old ranks would requantize
 * its first piece with a stale scale and fail this. Then training on stays
 * finite and close to the uninterrupted run. A checkpoint of the legacy
 * record ("q4/128") is read with the legacy maps and stored with today's. */
/* Training on after the round trip, in units of the group's lr: an Adam
 * step moves a weight by about lr at most, and the requantized m and v
 * change each update by a fraction of it (measured at most 0.05 lr for q8,
 * 0.42 lr for q4, whose 16 levels round much more, over the two steps):
 * three times that for q8; for q4 one step's worth, which still catches
 * lost or zeroed states (v = 0 makes an update m / eps). */
#define QRESHARD_TOL(sb, lb) ((sb) == 4 || (lb) == 4 ? 1.0 : 0.15)

static const struct {
    int sb, lb;
    int legacy;    /* saved with the legacy maps' record ("q4/128": v's map with a zero) */
    uint64_t tile; /* the load's tile (test hook; 0: the default 2^20, larger than SGSIZE) */
} qcases[] = {{8, 8}, {4, 4}, {0, 8}, {8, 0}, {4, 8}, {4, 4, 1}, {8, 8, 0, 4096}};

extern int zo__optim_legacy_qmaps;
extern uint64_t zo__part_reshard_tile;

START_TEST(test_part_reshard_quantized)
{
    /* every pair on host placement; the same-type ones on NVMe too */
    int nq = (int)(sizeof(qcases) / sizeof(qcases[0]));
    int place = _i >= nq;
    int qc = _i % nq;
    pcase ps = {2, ZO_DTYPE_F32, place ? ZO_OPTIM_PLACE_NVME : ZO_OPTIM_PLACE_HOST, 1, 4, 64 << 10};
    pcase pl = ps;
    ps.bits = qcases[qc].sb;
    pl.bits = qcases[qc].lb;
    char dir[4096], ck[4200];
    zo_test_mkdtemp(dir, sizeof(dir));
    snprintf(ck, sizeof(ck), "%s/ck", dir);
    train_arg ta = {.pc = &ps, .nvme = dir, .ckroot = ck, .save_at = 2};
    run sv;
    zo__optim_legacy_qmaps = qcases[qc].legacy; /* the forked ranks inherit it */
    run_ranks(&sv, 2, sizeof(qres), rank_qrun, &ta);
    zo__optim_legacy_qmaps = 0;
    if (qcases[qc].legacy) { /* the record is the old one indeed */
        char r0[4300];
        zo_ckpt_reader *rd = NULL;
        snprintf(r0, sizeof(r0), "%s/rank0", ck);
        ck_assert_int_eq(zo_ckpt_open(&rd, r0, "ck1"), 0);
        ck_assert_msg(strstr(zo_ckpt_user_json(rd), "\"states\":[\"q4/128\",\"q4/128\"]"), "%s",
                      zo_ckpt_user_json(rd));
        zo_ckpt_close(&rd);
    }
    qres *s0 = (qres *)run_res(&sv, 0), *s1 = (qres *)run_res(&sv, 1);
    ck_assert_int_eq(memcmp(s0->params, s1->params, sizeof(s0->params)), 0);
    /* x: the old states, concatenated from the old shards */
    float(*x)[TOTAL] = malloc(sizeof(s0->st));
    float *want = malloc((size_t)SGSIZE * 4);
    ck_assert(x && want);
    for (unsigned g = 0; g < 2; g++)
        for (unsigned r = 0; r < 2; r++) {
            uint64_t lo, n, gbase = g ? qgroup_numel[0] : 0;
            shard_of(g, r, 2, &lo, &n);
            for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++)
                memcpy(x[k] + gbase + lo, ((qres *)run_res(&sv, r))->st[k] + gbase + lo, n * 4);
        }
    for (unsigned w = 1; w <= 3; w += 2) {
        char ck2[4300];
        snprintf(ck2, sizeof(ck2), "%s/ck-at-%u", dir, w);
        train_arg la = ta;
        la.pc = &pl;
        la.name = "ck1";
        la.resave = ck2;
        run ld;
        uint64_t tile0 = zo__part_reshard_tile;
        if (qcases[qc].tile) /* tiles that split the sub-groups (and start inside old shards) */
            zo__part_reshard_tile = qcases[qc].tile;
        run_ranks(&ld, w, sizeof(qres), rank_qrun, &la);
        zo__part_reshard_tile = tile0;
        double maxd = 0;
        for (unsigned r = 0; r < w; r++) {
            qres *q = (qres *)run_res(&ld, r);
            for (unsigned g = 0; g < 2; g++) {
                uint64_t lo, n, gbase = g ? qgroup_numel[0] : 0;
                shard_of(g, r, w, &lo, &n);
                for (uint64_t a = 0; a < n; a += SGSIZE) {
                    uint64_t c = n - a < SGSIZE ? n - a : SGSIZE, e0 = gbase + lo + a;
                    for (int k = 0; k < ZO_OPTIM_STATE_COUNT; k++) {
                        expect_sg(x[k] + e0, c, k, pl.bits, want);
                        for (uint64_t i = 0; i < c; i++)
                            ck_assert_msg(!memcmp(&want[i], &q->st[k][e0 + i], 4),
                                          "q%d -> q%d, 2 -> %u ranks, rank %u, group %u, state %d, element %llu: "
                                          "%a, expected %a (old %a)", ps.bits, pl.bits, w, r, g, k,
                                          (unsigned long long)(e0 + i), (double)q->st[k][e0 + i], (double)want[i],
                                          (double)x[k][e0 + i]);
                    }
                }
            }
            for (uint64_t e = 0; e < TOTAL; e++) /* trained on at w ranks (another gradient: rank-dependent) */
                ck_assert_msg(isfinite(q->params[e]), "rank %u of %u: param %llu not finite", r, w,
                              (unsigned long long)e);
        }
        run_free(&ld);
        /* Back at 2 ranks (resharded again) and trained on: the gradients
         * are the uninterrupted run's again, so the params differ from its
         * only by what the requantizations (and, between state types, the
         * quantized training itself) changed in two steps. */
        train_arg ba = la;
        ba.ckroot = ck2;
        ba.name = "ck2";
        ba.resave = NULL;
        run bk;
        run_ranks(&bk, 2, sizeof(qres), rank_qrun, &ba);
        for (unsigned r = 0; r < 2; r++) {
            qres *q = (qres *)run_res(&bk, r);
            for (uint64_t e = 0; e < TOTAL; e++) {
                double lr = e < qgroup_numel[0] ? 1e-2 : 5e-3, d = fabs((double)q->params[e] - s0->params[e]);
                ck_assert_msg(isfinite(q->params[e]), "2 -> %u -> 2 ranks, rank %u: param %llu not finite", w, r,
                              (unsigned long long)e);
                ck_assert_msg(d <= QRESHARD_TOL(ps.bits, pl.bits) * lr, "q%d -> q%d, 2 -> %u -> 2 ranks, rank %u: param %llu is %a, "
                              "the uninterrupted run's %a", ps.bits, pl.bits, w, r, (unsigned long long)e,
                              (double)q->params[e], (double)s0->params[e]);
                maxd = d / lr > maxd ? d / lr : maxd;
            }
        }
        printf("reshard q%d%s -> q%d, 2 -> %u -> 2 ranks (%s%s): trained on, max |param - uninterrupted| = %.3g "
               "lr\n", ps.bits, qcases[qc].legacy ? " (legacy maps)" : "", pl.bits, w, place ? "nvme" : "host",
               qcases[qc].tile ? ", small tiles" : "", maxd);
        run_free(&bk);
    }
    free(x);
    free(want);
    run_free(&sv);
    zo_test_rmtree(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("part");
    TCase *tc = tcase_create("ranks");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_part_matches_single, 0, (int)(sizeof(cases) / sizeof(cases[0])));
    tcase_add_loop_test(tc, test_part_checkpoint, 0, 2);
    tcase_add_test(tc, test_part_commit_crash);
    suite_add_tcase(s, tc);
    /* host and NVMe placement apart: tests/meson.build runs them as separate
     * tests, so the slow builds (sanitizers, qemu) run them side by side */
    int nq = (int)(sizeof(qcases) / sizeof(qcases[0]));
    TCase *tq = tcase_create("reshard-q");
    tcase_set_timeout(tq, 300);
    tcase_add_loop_test(tq, test_part_reshard_quantized, 0, nq);
    suite_add_tcase(s, tq);
    TCase *tqn = tcase_create("reshard-q-nvme");
    tcase_set_timeout(tqn, 300);
    tcase_add_loop_test(tqn, test_part_reshard_quantized, nq, nq + 2);
    suite_add_tcase(s, tqn);
    TCase *tcc = tcase_create("contract");
    tcase_set_timeout(tcc, 120);
    tcase_add_test(tcc, test_part_comm_fails);
    tcase_add_test(tcc, test_part_move_params);
    tcase_add_test(tcc, test_part_async_comm_fails);
    tcase_add_test(tcc, test_part_bad_config);
    tcase_add_test(tcc, test_part_state_maps);
    suite_add_tcase(s, tcc);
    return zo_test_run(s);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* zo-adam-bench: how fast the CPU optimizer step runs, against the
 * machine's in-place streaming bound measured on the same arrays with the
 * same threads in the same run (alternating, median of pairs), and
 * optionally against torch.optim in a python3 child fed step by step. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zoffload/zoffload.h>

#include "tool_common.h"

#define MAX_PAIRS 1000

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zo-adam-bench [options]\n"
            "  --n N              parameters per step (default 1e8; accepts 1e8, 100M, 100000000)\n"
            "  --optimizer K      adamw (default), adam, adagrad, lion\n"
            "  --grad T           gradient type: fp32 (default), fp16, bf16\n"
            "  --out T            updated-parameter copy: none (default), bf16, fp16, fp32\n"
            "  --state T          optimizer state type: fp32 (default), bf16, q8, q4 (block-wise\n"
            "                     quantized moments, dynamic maps; Adam/AdamW/Lion)\n"
            "  --block B          elements per scale of q8/q4 states (default 256 / 128)\n"
            "  --threads T        threads (default: CPUs available)\n"
            "  --variant V        auto (default), scalar, avx2, avx512, avx512bf16 (x86-64), neon (aarch64)\n"
            "  --pairs P          timed (bound, step) pairs, median reported (default 7, >= 1)\n"
            "  --nt M             streaming stores for the out copy: auto (default), on, off\n"
            "  --tile N           elements per tile (team setting; default the library's)\n"
            "  --pin              pin the OpenMP threads to CPUs\n"
            "  --vs-torch         also time torch.optim (same n, threads), alternating\n"
            "  --python PATH      interpreter for --vs-torch (default $ZO_PYTHON, /usr/bin/python3)\n"
            "  --small            also time small slices (n = 1e3, 1e4, 1e5) per call\n"
            "  --json             one JSON object on stdout\n"
            "  --verbose          print every pair\n"
            "environment: ZO_CPU_MASK lowers the CPU features auto dispatch may use\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double tmp[MAX_PAIRS];
    memcpy(tmp, v, sizeof(double) * (size_t)n);
    qsort(tmp, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

/* "1e8", "100M" (decimal: 10^6), "100000000" */
static int parse_count(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || errno)
        return -1;
    double mult = 1;
    if (*end == 'k' || *end == 'K')
        mult = 1e3, end++;
    else if (*end == 'm' || *end == 'M')
        mult = 1e6, end++;
    else if (*end == 'g' || *end == 'G')
        mult = 1e9, end++;
    if (*end || !(d > 0) || d * mult > 1e13 || d * mult != floor(d * mult))
        return -1;
    *out = (size_t)(d * mult);
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

typedef struct {
    const char *name;
    int value;
} name_val;

static int lookup(const name_val *t, const char *s, int *out)
{
    for (; t->name; t++)
        if (!strcmp(t->name, s)) {
            *out = t->value;
            return 0;
        }
    return -1;
}

static const name_val kinds[] = {{"adamw", ZO_OPTIM_ADAMW}, {"adam", ZO_OPTIM_ADAM},
                                 {"adagrad", ZO_OPTIM_ADAGRAD}, {"lion", ZO_OPTIM_LION}, {0, 0}};
static const name_val gtypes[] = {{"fp32", ZO_DTYPE_F32}, {"f32", ZO_DTYPE_F32}, {"fp16", ZO_DTYPE_F16},
                                  {"f16", ZO_DTYPE_F16}, {"bf16", ZO_DTYPE_BF16}, {0, 0}};
static const name_val otypes[] = {{"none", -1}, {"fp32", ZO_DTYPE_F32}, {"f32", ZO_DTYPE_F32},
                                  {"fp16", ZO_DTYPE_F16}, {"f16", ZO_DTYPE_F16}, {"bf16", ZO_DTYPE_BF16},
                                  {0, 0}};
static const name_val stypes[] = {{"fp32", ZO_DTYPE_F32}, {"f32", ZO_DTYPE_F32}, {"bf16", ZO_DTYPE_BF16}, {0, 0}};
static const name_val ntmodes[] = {{"auto", ZO_CPUADAM_NT_AUTO}, {"on", ZO_CPUADAM_NT_ON},
                                   {"off", ZO_CPUADAM_NT_OFF}, {0, 0}};

static const char *kind_str(int k)
{
    for (const name_val *t = kinds; t->name; t++)
        if (t->value == k)
            return t->name;
    return "?";
}

/* ---- arrays ------------------------------------------------------------------ */
typedef struct {
    size_t n;
    float *p, *g32, *m32, *v32; /* the bound kernel's four fp32 arrays (p, g32, and fp32 states) */
    void *g16, *m16, *v16, *out;
    uint8_t *mq, *vq; /* quantized moments (--state q8/q4) and their scales */
    float *ms, *vs;
} arrays;

static void *xalloc(size_t bytes)
{
    void *p = NULL;
    int rc = zo_aligned_alloc(&p, bytes, 64);
    if (rc < 0) {
        fprintf(stderr, "zo-adam-bench: allocating %zu bytes: %s\n", bytes, zo_strerror(rc));
        return NULL;
    }
    return p;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static float rng_uniform(uint64_t *s) /* [-1, 1) */
{
    return (float)((double)(rng_next(s) >> 40) * 0x1p-23 - 1.0);
}

static int arrays_init(arrays *a, size_t n, zo_dtype gt, int ot, zo_dtype st, int qbits, size_t block)
{
    memset(a, 0, sizeof(*a));
    a->n = n;
    if (!(a->p = xalloc(n * 4)) || !(a->g32 = xalloc(n * 4)) || !(a->m32 = xalloc(n * 4)) ||
        !(a->v32 = xalloc(n * 4)))
        return -1;
    if (gt != ZO_DTYPE_F32 && !(a->g16 = xalloc(n * 2)))
        return -1;
    if (st != ZO_DTYPE_F32 && (!(a->m16 = xalloc(n * 2)) || !(a->v16 = xalloc(n * 2))))
        return -1;
    if (ot >= 0 && !(a->out = xalloc(n * zo_dtype_size((zo_dtype)ot))))
        return -1;
    size_t cbytes = qbits == 8 ? n : (n + 1) / 2, nb = (n - 1) / (block ? block : 1) + 1;
    if (qbits && (!(a->mq = xalloc(cbytes)) || !(a->vq = xalloc(cbytes)) || !(a->ms = xalloc(nb * 4)) ||
                  !(a->vs = xalloc(nb * 4))))
        return -1;
    if (qbits) { /* fresh moments: every code 0, every scale 0 */
        memset(a->mq, 0, cbytes);
        memset(a->vq, 0, cbytes);
        memset(a->ms, 0, nb * 4);
        memset(a->vs, 0, nb * 4);
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        a->p[i] = rng_uniform(&s);
        a->g32[i] = rng_uniform(&s) * 1e-2f;
        a->m32[i] = 0;
        a->v32[i] = 0;
    }
    if (a->g16)
        zo_vec_cast(a->g16, gt, a->g32, ZO_DTYPE_F32, n);
    if (a->m16) {
        memset(a->m16, 0, n * 2);
        memset(a->v16, 0, n * 2);
    }
    if (a->out)
        memset(a->out, 0, n * zo_dtype_size((zo_dtype)ot));
    return 0;
}

static void arrays_free(arrays *a)
{
    zo_aligned_free(a->p);
    zo_aligned_free(a->g32);
    zo_aligned_free(a->m32);
    zo_aligned_free(a->v32);
    zo_aligned_free(a->g16);
    zo_aligned_free(a->m16);
    zo_aligned_free(a->v16);
    zo_aligned_free(a->out);
    zo_aligned_free(a->mq);
    zo_aligned_free(a->vq);
    zo_aligned_free(a->ms);
    zo_aligned_free(a->vs);
}

static void qtensors_for(zo_cpuadam_qtensors *t, const arrays *a, size_t n, zo_dtype gt, int ot, int qbits,
                         size_t block)
{
    zo_cpuadam_qtensors_default(t);
    t->n = n;
    t->param = a->p;
    t->grad = gt == ZO_DTYPE_F32 ? (const void *)a->g32 : a->g16;
    t->grad_dtype = gt;
    t->bits = qbits;
    t->block = block;
    t->m_codes = a->mq;
    t->m_absmax = a->ms;
    t->v_codes = a->vq;
    t->v_absmax = a->vs;
    if (ot >= 0) {
        t->param_out = a->out;
        t->out_dtype = (zo_dtype)ot;
    }
}

static void tensors_for(zo_cpuadam_tensors *t, const arrays *a, size_t n, zo_dtype gt, int ot, zo_dtype st)
{
    zo_cpuadam_tensors_default(t);
    t->n = n;
    t->param = a->p;
    t->grad = gt == ZO_DTYPE_F32 ? (const void *)a->g32 : a->g16;
    t->grad_dtype = gt;
    t->state_dtype = st;
    t->exp_avg = st == ZO_DTYPE_F32 ? (void *)a->m32 : a->m16;
    t->exp_avg_sq = st == ZO_DTYPE_F32 ? (void *)a->v32 : a->v16;
    if (ot >= 0) {
        t->param_out = a->out;
        t->out_dtype = (zo_dtype)ot;
    }
}

/* Bytes one step moves per parameter; quantized states move their codes
 * (1 or 1/2 byte) and one fp32 scale per block, each read and written. */
static double step_bytes(int kind, zo_dtype gt, int ot, zo_dtype st, int qbits, size_t block)
{
    double s = qbits ? qbits / 8.0 + 4.0 / (double)block : (double)zo_dtype_size(st);
    int nstates = (kind == ZO_OPTIM_ADAMW || kind == ZO_OPTIM_ADAM) ? 2 : 1;
    return 8.0 + (double)zo_dtype_size(gt) + 2.0 * s * nstates + (ot >= 0 ? (double)zo_dtype_size((zo_dtype)ot) : 0.0);
}

/* ---- the torch child ---------------------------------------------------------- */
/* Reads "step\n" lines, answers each with the seconds of one optimizer
 * step. Skips (prints "SKIP reason" and exits 0) when torch is missing. */
static const char torch_script[] =
    "import sys, time, inspect\n"
    "try:\n"
    "    import torch\n"
    "except Exception as e:\n"
    "    print('SKIP cannot import torch: %s' % e, flush=True); sys.exit(0)\n"
    "n, threads, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
    "torch.set_num_threads(threads)\n"
    "cls = {'adamw': torch.optim.AdamW, 'adam': torch.optim.Adam, 'adagrad': torch.optim.Adagrad}.get(kind)\n"
    "if cls is None:\n"
    "    print('SKIP torch has no %s optimizer' % kind, flush=True); sys.exit(0)\n"
    "kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01) if kind != 'adagrad' else dict(lr=1e-2)\n"
    "g = torch.Generator().manual_seed(1)\n"
    "def make():\n"
    "    p = torch.nn.Parameter(torch.rand(n, generator=g) * 2 - 1)\n"
    "    p.grad = (torch.rand(n, generator=g) * 2 - 1) * 1e-2\n"
    "    return p\n"
    "sig = inspect.signature(cls).parameters\n"
    "modes = {}\n"
    "if 'foreach' in sig:\n"
    "    modes['foreach'] = cls([make()], foreach=True, **kw)\n"
    "else:\n"
    "    modes['for-loop'] = cls([make()], **kw)\n"
    "fused = 'not in this torch'\n"
    "if 'fused' in sig:\n"
    "    try:\n"
    "        o = cls([make()], fused=True, **kw); o.step(); modes['fused'] = o; fused = 'yes'\n"
    "    except Exception as e:\n"
    "        fused = 'unavailable on CPU: ' + str(e).splitlines()[0][:160]\n"
    "for o in modes.values():\n"
    "    o.step()\n"
    "print('READY torch=%s threads=%d modes=%s fused=%s' % (torch.__version__, torch.get_num_threads(),\n"
    "      ','.join(modes), fused.replace(' ', '_')), flush=True)\n"
    "for line in sys.stdin:\n"
    "    w = line.split()\n"
    "    if not w or w[0] == 'quit':\n"
    "        break\n"
    "    o = modes[w[1]]\n"
    "    t0 = time.perf_counter(); o.step(); t1 = time.perf_counter()\n"
    "    print('%.9f' % (t1 - t0), flush=True)\n";

typedef struct {
    pid_t pid;
    FILE *to, *from;
    char ready[512];
    char skip[512];
    char modes[4][16];
    int nmodes;
    char fused[256];
} torch_child;

static int torch_start(torch_child *c, const char *python, size_t n, int threads, const char *kind)
{
    memset(c, 0, sizeof(*c));
    int in[2], out[2];
    if (pipe(in) || pipe(out)) {
        snprintf(c->skip, sizeof(c->skip), "pipe: %s", strerror(errno));
        return -1;
    }
    char nbuf[32], tbuf[16];
    snprintf(nbuf, sizeof(nbuf), "%zu", n);
    snprintf(tbuf, sizeof(tbuf), "%d", threads);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(c->skip, sizeof(c->skip), "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        char omp[32];
        snprintf(omp, sizeof(omp), "%d", threads);
        setenv("OMP_NUM_THREADS", omp, 1);
        execlp(python, python, "-c", torch_script, nbuf, tbuf, kind, (char *)NULL);
        printf("SKIP cannot run %s: %s\n", python, strerror(errno));
        fflush(stdout);
        _exit(0);
    }
    close(in[0]);
    close(out[1]);
    c->pid = pid;
    c->to = fdopen(in[1], "w");
    c->from = fdopen(out[0], "r");
    if (!c->to || !c->from || !fgets(c->ready, sizeof(c->ready), c->from)) {
        snprintf(c->skip, sizeof(c->skip), "%s exited without answering (crashed, killed, or out of memory?)", python);
        return -1;
    }
    c->ready[strcspn(c->ready, "\n")] = 0;
    if (!strncmp(c->ready, "SKIP ", 5)) {
        snprintf(c->skip, sizeof(c->skip), "%s", c->ready + 5);
        return -1;
    }
    if (strncmp(c->ready, "READY ", 6)) {
        snprintf(c->skip, sizeof(c->skip), "unexpected answer from %s: %.200s", python, c->ready);
        return -1;
    }
    char *m = strstr(c->ready, "modes="), *f = strstr(c->ready, "fused=");
    if (m) {
        char list[128];
        sscanf(m + 6, "%127s", list);
        for (char *tok = strtok(list, ","); tok && c->nmodes < 4; tok = strtok(NULL, ","))
            snprintf(c->modes[c->nmodes++], sizeof(c->modes[0]), "%s", tok);
    }
    if (f) {
        snprintf(c->fused, sizeof(c->fused), "%s", f + 6);
        for (char *q = c->fused; *q; q++)
            if (*q == '_')
                *q = ' ';
    }
    return 0;
}

static double torch_step(torch_child *c, const char *mode)
{
    char line[64];
    fprintf(c->to, "step %s\n", mode);
    fflush(c->to);
    if (!fgets(line, sizeof(line), c->from))
        return -1;
    return strtod(line, NULL);
}

static void torch_stop(torch_child *c)
{
    if (c->to) {
        fprintf(c->to, "quit\n");
        fclose(c->to);
    }
    if (c->from)
        fclose(c->from);
    if (c->pid > 0) {
        int st;
        waitpid(c->pid, &st, 0);
    }
}

/* ---- main ------------------------------------------------------------------------ */
typedef struct {
    size_t n;
    double per_call, bytes, limit;
    int calls, within;
} small_row;

int main(int argc, char **argv)
{
    size_t n = 100000000, tile = 0;
    int kind = ZO_OPTIM_ADAMW, gt = ZO_DTYPE_F32, ot = -1, st = ZO_DTYPE_F32, nt = ZO_CPUADAM_NT_AUTO;
    int threads = 0, pairs = 7, pin = 0, json = 0, verbose = 0, vs_torch = 0, small = 0, qbits = 0;
    size_t block = 0;
    const char *variant = "auto";
    const char *python = getenv("ZO_PYTHON");
    signal(SIGPIPE, SIG_IGN); /* a torch child that died is reported, not fatal */
    if (!python || !*python)
        python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";

    static const struct option opts[] = {
        {"n", required_argument, 0, 'n'},        {"optimizer", required_argument, 0, 'o'},
        {"grad", required_argument, 0, 'g'},     {"out", required_argument, 0, 'O'},
        {"state", required_argument, 0, 's'},    {"threads", required_argument, 0, 't'},
        {"variant", required_argument, 0, 'V'},  {"pairs", required_argument, 0, 'p'},
        {"nt", required_argument, 0, 'N'},       {"pin", no_argument, 0, 'P'},
        {"vs-torch", no_argument, 0, 'T'},       {"python", required_argument, 0, 'y'},
        {"small", no_argument, 0, 'S'},          {"json", no_argument, 0, 'j'},
        {"verbose", no_argument, 0, 'v'},        {"help", no_argument, 0, 'h'},
        {"tile", required_argument, 0, 'L'},     {"block", required_argument, 0, 'B'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'n': bad = parse_count(optarg, &n); break;
        case 'o': bad = lookup(kinds, optarg, &kind); break;
        case 'g': bad = lookup(gtypes, optarg, &gt); break;
        case 'O': bad = lookup(otypes, optarg, &ot); break;
        case 's':
            qbits = !strcmp(optarg, "q8") ? 8 : !strcmp(optarg, "q4") ? 4 : 0;
            bad = qbits ? 0 : lookup(stypes, optarg, &st);
            break;
        case 'B': bad = parse_count(optarg, &block); break;
        case 't': bad = parse_int(optarg, 1, 1024, &threads); break;
        case 'V': variant = optarg; break;
        case 'p': bad = parse_int(optarg, 1, MAX_PAIRS, &pairs); break;
        case 'N': bad = lookup(ntmodes, optarg, &nt); break;
        case 'P': pin = 1; break;
        case 'T': vs_torch = 1; break;
        case 'y': python = optarg; break;
        case 'S': small = 1; break;
        case 'j': json = 1; break;
        case 'v': verbose = 1; break;
        case 'L': bad = parse_count(optarg, &tile); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            const char *name = "?";
            for (const struct option *o = opts; o->name; o++)
                if (o->val == c)
                    name = o->name;
            fprintf(stderr, "zo-adam-bench: bad value '%s' for --%s\n", optarg, name);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zo-adam-bench: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (strcmp(variant, "auto") && zo_cpuadam_variant_available(variant) < 0) {
        fprintf(stderr, "zo-adam-bench: unknown --variant '%s' (auto, scalar, avx2, avx512, avx512bf16, neon)\n", variant);
        return 2;
    }
    if (qbits && (small || vs_torch || kind == ZO_OPTIM_ADAGRAD)) {
        fprintf(stderr, "zo-adam-bench: --state q%d is for adam, adamw and lion, without --small and --vs-torch\n",
                qbits);
        return 2;
    }
    if (qbits && !block)
        block = qbits == 8 ? 256 : 128;
    if (small && n < 100000) {
        fprintf(stderr, "zo-adam-bench: --small needs --n >= 100000 (it times slices of the arrays)\n");
        return 2;
    }

    zo_cpuadam_team_config cfg;
    zo_cpuadam_team_config_default(&cfg);
    if (threads)
        cfg.nthreads = threads;
    cfg.pin = pin;
    cfg.variant = variant;
    cfg.nt_stores = (zo_cpuadam_nt)nt;
    if (tile)
        cfg.tile_elems = tile;
    zo_cpuadam_team *team = NULL, *bteam = NULL;
    int rc = zo_cpuadam_team_create(&team, &cfg);
    if (rc < 0) {
        fprintf(stderr, "zo-adam-bench: %s: %s\n", zo_strerror(rc), zo_last_error_detail());
        return rc == ZO_ENOTSUP ? 1 : 2;
    }
    threads = zo_cpuadam_team_threads(team);
    /* The bound runs with the best kernel this CPU allows, whatever variant
     * is being measured: it stands for the machine, not for the variant. */
    cfg.variant = "auto";
    rc = zo_cpuadam_team_create(&bteam, &cfg);
    if (rc < 0) {
        fprintf(stderr, "zo-adam-bench: %s: %s\n", zo_strerror(rc), zo_last_error_detail());
        zo_cpuadam_team_destroy(&team);
        return 1;
    }

    /* the torch child first: it forks before our arrays exist */
    torch_child tc;
    int have_torch = 0;
    if (vs_torch) {
        have_torch = torch_start(&tc, python, n, threads, kind_str(kind)) == 0;
        if (!have_torch && !json)
            fprintf(stderr, "zo-adam-bench: torch comparison skipped: %s\n", tc.skip);
    }

    zo_machine mach;
    zo_machine_get(&mach);
    arrays a;
    if (arrays_init(&a, n, (zo_dtype)gt, ot, (zo_dtype)st, qbits, block) < 0) {
        arrays_free(&a);
        return 1;
    }
    zo_cpuadam_hparams hp;
    zo_cpuadam_hparams_default(&hp, (zo_optim_kind)kind);
    zo_cpuadam_tensors t;
    tensors_for(&t, &a, n, (zo_dtype)gt, ot, (zo_dtype)st);
    zo_cpuadam_qtensors qt;
    qtensors_for(&qt, &a, n, (zo_dtype)gt, ot, qbits, block);
    double bpp = step_bytes(kind, (zo_dtype)gt, ot, (zo_dtype)st, qbits, block);
    char sname[16];
    snprintf(sname, sizeof(sname), "q%d", qbits);
    const char *state_name = qbits ? sname : zo_dtype_name((zo_dtype)st);

    /* warm up: page faults, OpenMP team start, pinning */
    int64_t step = 1;
    rc = zo_cpuadam_team_stream_bound(bteam, a.p, a.m32, a.v32, a.g32, 0.0f, n);
    hp.step = step++;
    if (rc == 0)
        rc = qbits ? zo_cpuadam_team_qstep(team, &hp, &qt) : zo_cpuadam_team_step(team, &hp, &t);
    if (rc < 0) {
        fprintf(stderr, "zo-adam-bench: %s: %s\n", zo_strerror(rc), zo_last_error_detail());
        return 1;
    }

    double tb[MAX_PAIRS], ts[MAX_PAIRS], ratio[MAX_PAIRS];
    double tt[4][MAX_PAIRS], tz[4][MAX_PAIRS], tr[4][MAX_PAIRS];
    for (int k = 0; k < pairs; k++) {
        double t0 = now_s();
        zo_cpuadam_team_stream_bound(bteam, a.p, a.m32, a.v32, a.g32, 0.0f, n);
        double t1 = now_s();
        hp.step = step++;
        if (qbits)
            zo_cpuadam_team_qstep(team, &hp, &qt);
        else
            zo_cpuadam_team_step(team, &hp, &t);
        double t2 = now_s();
        tb[k] = t1 - t0;
        ts[k] = t2 - t1;
        /* bandwidth ratio: equals tb/ts when the step moves 28 bytes */
        ratio[k] = (bpp / ts[k]) / (28.0 / tb[k]);
        if (verbose && !json)
            printf("pair %d: bound %.2f ms, step %.2f ms, ratio %.3f\n", k, tb[k] * 1e3, ts[k] * 1e3, ratio[k]);
    }
    if (have_torch) {
        for (int mi = 0; mi < tc.nmodes && have_torch; mi++) {
            for (int k = 0; k < pairs; k++) {
                double t0 = now_s();
                hp.step = step++;
                zo_cpuadam_team_step(team, &hp, &t);
                tz[mi][k] = now_s() - t0;
                tt[mi][k] = torch_step(&tc, tc.modes[mi]);
                if (tt[mi][k] <= 0) {
                    snprintf(tc.skip, sizeof(tc.skip), "the python3 child stopped answering (killed? out of memory?)");
                    have_torch = 0;
                    break;
                }
                tr[mi][k] = tt[mi][k] / tz[mi][k];
                if (verbose && !json)
                    printf("torch %s pair %d: zoffload %.2f ms, torch %.2f ms, speedup %.2f\n", tc.modes[mi], k,
                           tz[mi][k] * 1e3, tt[mi][k] * 1e3, tr[mi][k]);
            }
        }
    }
    if (vs_torch)
        torch_stop(&tc);

    /* small slices: per-call time with the data hot, against max(2 x bytes
     * / bound bandwidth, 5 us) */
    small_row rows[3];
    int nrows = 0;
    double bound_bw = 28.0 * (double)n / median(tb, pairs);
    if (small) {
        static const size_t sizes[] = {1000, 10000, 100000};
        for (int r = 0; r < 3; r++) {
            zo_cpuadam_tensors ts_small = t;
            ts_small.n = sizes[r];
            int calls = (int)(2e-3 / (bpp * (double)sizes[r] / bound_bw + 1e-6)) + 1;
            double per[MAX_PAIRS];
            for (int k = 0; k < pairs; k++) {
                double t0 = now_s();
                for (int q = 0; q < calls; q++) {
                    hp.step = step++;
                    zo_cpuadam_team_step(team, &hp, &ts_small);
                }
                per[k] = (now_s() - t0) / calls;
            }
            small_row *row = &rows[nrows++];
            row->n = sizes[r];
            row->calls = calls;
            row->per_call = median(per, pairs);
            row->bytes = bpp * (double)sizes[r];
            row->limit = fmax(2.0 * row->bytes / bound_bw, 5e-6);
            row->within = row->per_call <= row->limit;
        }
    }

    double sec = median(ts, pairs), bsec = median(tb, pairs), rat = median(ratio, pairs);
    const char *vname = zo_cpuadam_team_variant(team);
    if (json) {
        zo_json j;
        zj_init(&j, stdout, 1);
        zj_obj_begin(&j, NULL);
        zj_str(&j, "tool", "zo-adam-bench");
        zo_machine_json(&mach, &j, "machine");
        zj_str(&j, "optimizer", kind_str(kind));
        zj_str(&j, "grad", zo_dtype_name((zo_dtype)gt));
        zj_str(&j, "state", state_name);
        if (qbits)
            zj_uint(&j, "block", block);
        zj_str(&j, "out", ot >= 0 ? zo_dtype_name((zo_dtype)ot) : "none");
        zj_str(&j, "variant", vname);
        zj_str(&j, "nt", nt == ZO_CPUADAM_NT_AUTO ? "auto" : nt == ZO_CPUADAM_NT_ON ? "on" : "off");
        zj_bool(&j, "pinned", pin);
        zj_uint(&j, "n", n);
        zj_int(&j, "threads", threads);
        zj_int(&j, "pairs", pairs);
        if (tile)
            zj_uint(&j, "tile", tile);
        zj_num(&j, "bytes_per_param", bpp);
        zj_num(&j, "seconds", sec);
        zj_num(&j, "params_per_s", (double)n / sec);
        zj_num(&j, "bytes_per_s", bpp * (double)n / sec);
        zj_num(&j, "bound_seconds", bsec);
        zj_num(&j, "bound_params_per_s", (double)n / bsec);
        zj_num(&j, "bound_bytes_per_s", 28.0 * (double)n / bsec);
        zj_num(&j, "ratio_to_bound", rat);
        if (vs_torch) {
            zj_obj_begin(&j, "torch");
            if (!have_torch) {
                zj_str(&j, "skipped", tc.skip);
            } else {
                zj_str(&j, "info", tc.ready + 6);
                /* the modes have an object of their own: one of them is
                 * called "fused", as the availability note used to be */
                zj_str(&j, "fused_status", tc.fused);
                zj_obj_begin(&j, "modes");
                for (int mi = 0; mi < tc.nmodes; mi++) {
                    zj_obj_begin(&j, tc.modes[mi]);
                    zj_num(&j, "seconds", median(tt[mi], pairs));
                    zj_num(&j, "zoffload_seconds", median(tz[mi], pairs));
                    zj_num(&j, "speedup", median(tr[mi], pairs));
                    zj_obj_end(&j);
                }
                zj_obj_end(&j);
            }
            zj_obj_end(&j);
        }
        if (small) {
            zj_arr_begin(&j, "small");
            for (int r = 0; r < nrows; r++) {
                zj_obj_begin(&j, NULL);
                zj_uint(&j, "n", rows[r].n);
                zj_num(&j, "seconds_per_call", rows[r].per_call);
                zj_num(&j, "bytes", rows[r].bytes);
                zj_num(&j, "limit_seconds", rows[r].limit);
                zj_bool(&j, "within", rows[r].within);
                zj_obj_end(&j);
            }
            zj_arr_end(&j);
        }
        zj_obj_end(&j);
        zj_end(&j);
    } else {
        zo_machine_print(&mach, stdout);
        printf("%s, grad %s, states %s, out %s, n %zu, %d threads%s, variant %s, %d pairs\n", kind_str(kind),
               zo_dtype_name((zo_dtype)gt), state_name, ot >= 0 ? zo_dtype_name((zo_dtype)ot) : "none",
               n, threads, pin ? " (pinned)" : "", vname, pairs);
        printf("step:  %9.3f ms  %8.3f Gparams/s  %7.2f GB/s (%.0f B/param)\n", sec * 1e3, (double)n / sec * 1e-9,
               bpp * (double)n / sec * 1e-9, bpp);
        printf("bound: %9.3f ms  %8.3f Gparams/s  %7.2f GB/s (28 B/param, in place, same arrays)\n", bsec * 1e3,
               (double)n / bsec * 1e-9, 28.0 * (double)n / bsec * 1e-9);
        printf("ratio to bound: %.3f (median of per-pair ratios)\n", rat);
        if (vs_torch && have_torch) {
            printf("torch: %s\n", tc.ready + 6);
            for (int mi = 0; mi < tc.nmodes; mi++)
                printf("torch %-8s %9.3f ms  zoffload %9.3f ms  speedup %.2fx (median of pairs)\n", tc.modes[mi],
                       median(tt[mi], pairs) * 1e3, median(tz[mi], pairs) * 1e3, median(tr[mi], pairs));
            if (strcmp(tc.fused, "yes"))
                printf("torch fused: %s\n", tc.fused);
        } else if (vs_torch) {
            printf("torch: skipped (%s)\n", tc.skip);
        }
        for (int r = 0; r < nrows; r++)
            printf("small n=%-7zu %8.2f us/call  limit %7.2f us (max(2 x %.0f B / %.1f GB/s, 5 us))  %s\n", rows[r].n,
                   rows[r].per_call * 1e6, rows[r].limit * 1e6, rows[r].bytes, bound_bw * 1e-9,
                   rows[r].within ? "within" : "OVER");
    }
    zo_cpuadam_team_destroy(&team);
    zo_cpuadam_team_destroy(&bteam);
    arrays_free(&a);
    return 0;
}

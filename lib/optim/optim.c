/* skeleton: every entry point answers ZO_ENOTSUP until implemented */
#define ZO_MODULE "optim"
#include "core/internal.h"
#include <zoffload/optim.h>
#include <zoffload/dev.h>

#include <string.h>

void zo_optim_group_default(zo_optim_group *g)
{
    if (!g)
        return;
    memset(g, 0, sizeof(*g));
    g->struct_size = sizeof(*g);
    g->placement = ZO_OPTIM_PLACE_DEFAULT;
    g->state_dtype = ZO_DTYPE_F32;
}

void zo_optim_config_default(zo_optim_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    cfg->param_dtype = ZO_DTYPE_BF16;
    cfg->grad_dtype = ZO_DTYPE_COUNT;
    zo_optim_hparams_default(&cfg->hparams, ZO_OPTIM_ADAMW);
    cfg->placement = ZO_OPTIM_PLACE_HOST;
    cfg->pin_memory = 1;
    cfg->buffer_count = 4;
    cfg->sub_group_size = (uint64_t)1 << 24;
    cfg->grad_staging_bytes = (size_t)32 << 20;
    cfg->aio_block_size = (size_t)1 << 20;
    cfg->aio_queue_depth = 32;
    cfg->aio_threads = 1;
    cfg->initial_scale_power = 16;
    cfg->loss_scale_window = 1000;
    cfg->hysteresis = 2;
    cfg->min_loss_scale = 1.0;
    cfg->grad_accum_steps = 1;
    cfg->clip_mode = ZO_OPTIM_CLIP_TWO_PASS;
    cfg->nonfinite = ZO_OPTIM_NONFINITE_ERROR;
    cfg->dpu_warmup_steps = 1;
    cfg->numa_node = -1;
}

int zo_optim_create(zo_optim **out, const zo_optim_config *cfg)
{
    return ZO_ENOTSUP;
}

void zo_optim_destroy(zo_optim **o)
{
    
}

const char *zo_optim_errmsg(const zo_optim *o)
{
    return "";
}

unsigned zo_optim_tensor_count(const zo_optim *o)
{
    return 0;
}

int zo_optim_tensor_index(const zo_optim *o, const char *name, unsigned *index)
{
    return ZO_ENOTSUP;
}

int zo_optim_tensor_get(const zo_optim *o, unsigned index, uint64_t *numel, unsigned *group, const char **name)
{
    return ZO_ENOTSUP;
}

int zo_optim_init_from_device(zo_optim *o)
{
    return ZO_ENOTSUP;
}

int zo_optim_state_export(zo_optim *o, unsigned index, zo_optim_state which, void *dst, zo_dtype dtype, uint64_t off, uint64_t n)
{
    return ZO_ENOTSUP;
}

int zo_optim_state_import(zo_optim *o, unsigned index, zo_optim_state which, const void *src, zo_dtype dtype, uint64_t off, uint64_t n)
{
    return ZO_ENOTSUP;
}

int zo_optim_push_params(zo_optim *o)
{
    return ZO_ENOTSUP;
}

int zo_optim_grad(zo_optim *o, unsigned index, const void *dev_grad, struct zo_event *ready)
{
    return ZO_ENOTSUP;
}

int zo_optim_grad_bucket(zo_optim *o, const zo_optim_grad_ref *refs, unsigned n, struct zo_event *ready)
{
    return ZO_ENOTSUP;
}

int zo_optim_grad_host(zo_optim *o, unsigned index, const void *host_grad, zo_dtype dtype)
{
    return ZO_ENOTSUP;
}

int zo_optim_grads_done(zo_optim *o)
{
    return ZO_ENOTSUP;
}

int zo_optim_grad_norm_partial(zo_optim *o, double *sumsq, uint64_t *nonfinite)
{
    return ZO_ENOTSUP;
}

void zo_optim_step_opts_default(zo_optim_step_opts *opts)
{
    
}

int zo_optim_step_async(zo_optim *o, const zo_optim_step_opts *opts)
{
    return ZO_ENOTSUP;
}

int zo_optim_wait(zo_optim *o, zo_optim_step_result *res)
{
    return ZO_ENOTSUP;
}

int zo_optim_step(zo_optim *o, const zo_optim_step_opts *opts, zo_optim_step_result *res)
{
    return ZO_ENOTSUP;
}

int zo_optim_poll(zo_optim *o)
{
    return ZO_ENOTSUP;
}

int zo_optim_eventfd(zo_optim *o)
{
    return ZO_ENOTSUP;
}

int zo_optim_params_current(zo_optim *o)
{
    return ZO_ENOTSUP;
}

int zo_optim_set_lr(zo_optim *o, unsigned group, double lr)
{
    return ZO_ENOTSUP;
}

int zo_optim_set_hparams(zo_optim *o, unsigned group, const zo_optim_hparams *hp)
{
    return ZO_ENOTSUP;
}

int zo_optim_param_buffer(zo_optim *o, unsigned index, const void **host)
{
    return ZO_ENOTSUP;
}

int zo_optim_save(zo_optim *o, const char *root, const char *name, unsigned keep_last, const char *user_json)
{
    return ZO_ENOTSUP;
}

int zo_optim_load(zo_optim *o, const char *root, const char *name, char *user_json, size_t len)
{
    return ZO_ENOTSUP;
}

int zo_optim_get_info(zo_optim *o, zo_optim_info *info)
{
    return ZO_ENOTSUP;
}

int zo_optim_get_timeline(zo_optim *o, zo_optim_timeline *tl)
{
    return ZO_ENOTSUP;
}

int zo_optim_timeline_json(zo_optim *o, char *buf, size_t len)
{
    return ZO_ENOTSUP;
}

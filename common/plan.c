/* The plan arithmetic (plan.h). */
#include "common/plan.h"

double ch_plan_flops(const ch_model_cfg_t *cfg, uint32_t B)
{
    double s = cfg->seq_len, l = cfg->layers, h = cfg->embd, V = cfg->padded_vocab;
    return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
}

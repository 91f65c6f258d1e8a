/* Where a rank computes, as one object: what differs between the CPU and one GPU, asked
 * of it so that the job kinds (workerd/rank/train.c) carry no #if. It owns the backend
 * (NULL on the CPU: the trainer's default, the CPU table) and says how the collectives
 * reach the backend's memory: UCX on host memory; NCCL on the GPU's stream; or UCX through
 * host copies when ranks share one GPU (NCCL refuses that). A CPU-only build opens only
 * CH_DEVICE_CPU. */
#ifndef ENG_DEVICE_H
#define ENG_DEVICE_H

#include "common/device.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/backend.h"

typedef struct eng_device eng_device_t;

typedef struct eng_device_opts {
    int gpu;  /* CH_DEVICE_CUDA: the GPU's ordinal among the visible ones */
    int tf32; /* CH_DEVICE_CUDA: GEMMs on TF32 tensor cores */
    int bf16; /* CH_DEVICE_CUDA: train.precision = bf16 (its GEMMs on bf16 operands) */
    /* CH_DEVICE_CUDA: reserve the launchers' scratch for a micro-batch of B sequences of T
     * tokens, C channels, NH heads now, rather than inside the first steps (0: don't) */
    int B, T, C, NH;
} eng_device_opts_t;

/* 0 and *out (eng_device_close), or -ENOTSUP (cuda in a build without it), -ENODEV,
 * -ENOMEM, CH_E_CUDA with err (errlen bytes) saying what failed. */
int eng_device_open(ch_device_t kind, const eng_device_opts_t *o, eng_device_t **out, char *err,
                    size_t errlen);
/* After every user of its backend (trainer, collectives); NULL is a no-op. */
void eng_device_close(eng_device_t *d);
ch_device_t eng_device_kind(const eng_device_t *d);
/* The GPU's ordinal; -1 on the CPU. */
int eng_device_gpu(const eng_device_t *d);
/* The backend to hand the trainer (eng_trainer_opts_t.backend): NULL on the CPU. Borrowed
 * until eng_device_close. */
eng_backend_t *eng_device_backend(const eng_device_t *d);
/* The collectives' backend and where they find this device's buffers, into cfg (already
 * defaulted). shared: other ranks compute on the same GPU. stage: storage for the
 * host-staged table, which must outlive the collectives context. Returns 1 when the
 * collectives go host-staged, else 0. */
int eng_device_coll_config(const eng_device_t *d, int shared, wrk_coll_config_t *cfg,
                           wrk_coll_stage_t *stage);

#endif

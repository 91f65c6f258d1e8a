/* The CUDA backend as a loadable module (private to workerd/engine/backend_cuda*.c).
 *
 * Why a module: cuBLAS and cuBLASLt cost every process that links them about 1.5 s and
 * 200 MB at start (their constructors), whether it uses a GPU or not; a CPU rank must not pay
 * that (its first step has fault.step_timeout to meet). So backend_cuda.c, kernels/cuda and
 * the CUDA libraries are one shared object, libchorus_engine_cuda.so, built next to
 * chorus-rank; the engine (backend_cuda_load.c) dlopens it the first time a CUDA backend is
 * asked for and calls it through this table, the one symbol it exports. */
#ifndef ENG_BACKEND_CUDA_H
#define ENG_BACKEND_CUDA_H

#include "workerd/engine/backend.h"

#define ENG_CUDA_MODULE_FILE   "libchorus_engine_cuda.so"
#define ENG_CUDA_MODULE_SYMBOL "eng_cuda_module"
/* 2: backend.h's table grew the tp_* entries; 3: reserve; 4: att_row; 5: bf16_round and
 * set_bf16; 6: timer_mark and timer_read; 7: bf16_cast; 8: sumsq_to and loss_acc; 9: bf16_weights
 */
#define ENG_CUDA_MODULE_ABI 9

/* How the module reports an error it cannot return (a launch failure noticed later): one
 * line, logged by the engine. */
typedef void (*eng_cuda_log_fn)(const char *msg);

typedef struct eng_cuda_module {
    int abi; /* ENG_CUDA_MODULE_ABI */
    /* backend.h's eng_backend_cuda_* of the same names; create takes the log hook */
    int (*devices)(int *count);
    int (*create)(int device, eng_cuda_log_fn log, eng_backend_t **out);
    void (*destroy)(eng_backend_t *be);
    void (*set_tf32)(eng_backend_t *be, int on);
    void (*set_bf16)(eng_backend_t *be, int on);
    void *(*stream)(const eng_backend_t *be);
    int (*sync)(const eng_backend_t *be);
    int (*reserve)(eng_backend_t *be, int B, int T, int C, int NH);
} eng_cuda_module_t;

#endif

/* devsim: a fake device backend for tests (workerd/engine/backend.h). Its memory is not host
 * memory (host_memory = 0) and its kernels are the CPU backend's, so without a GPU a test can
 * prove that the engine reaches backend memory only through the table (copy, memset, kernels)
 * and that its staging copies are right: the results are the CPU backend's bits.
 *
 * Poison mode: each allocation is a memfd mapped twice, a read/write "host view" the kernels
 * run on and a PROT_NONE "device view" whose address alloc hands out. A direct host read or
 * write of backend memory faults (SIGSEGV); pointer arithmetic within an allocation works,
 * since every entry translates each device pointer (any address in [base, base + size] of a
 * live allocation) to the same offset of its host view. A pointer argument that must be
 * backend memory and lies in no live allocation (a host pointer handed to a kernel), a copy
 * or memset running past its allocation, or a free of a pointer alloc never handed out,
 * aborts with a message naming the entry and the pointer.
 *
 * Plain mode (poison = 0): host memory aligned to 64 bytes, pointers unchanged, no checks, for
 * ranks whose collectives (shm, UCX) read the buffers on the host; still host_memory = 0, so
 * the engine takes its device paths. Both modes count what they do (devsim_stats).
 *
 * Linux only (memfd_create, mmap). Any thread may call any entry. */
#ifndef TEST_DEVSIM_H
#define TEST_DEVSIM_H

#include <stdint.h>

#include "workerd/engine/backend.h"

/* A new devsim backend (name "devsim", every entry of the table set). Caller owns *out:
 * devsim_destroy after every user of it. 0 or -ENOMEM. */
int devsim_create(int poison, eng_backend_t **out);
/* Frees the table; allocations still live are unmapped too. NULL is fine. */
void devsim_destroy(eng_backend_t *be);

typedef struct devsim_stats {
    uint64_t h2d, d2h, d2d;        /* copies by direction (zero-byte ones included) */
    uint64_t h2d_bytes, d2h_bytes; /* bytes moved across the host/device boundary */
    uint64_t allocs;               /* successful allocs so far */
    uint64_t live;                 /* allocations not yet freed */
    uint64_t syncs;                /* calls of sync */
    uint64_t sumsq;                /* calls of sumsq: a result the host reads (a GPU: waits) */
    uint64_t timer_marks;          /* calls of timer_mark (host clocks: see devsim.c) */
    uint64_t tp_kernels;           /* calls of the vocab-parallel entries (tp_*) */
    uint64_t w16_reads;            /* weight elements the matmuls read from a bf16 working copy */
} devsim_stats_t;

/* be must come from devsim_create. */
void devsim_stats(const eng_backend_t *be, devsim_stats_t *out);

#endif

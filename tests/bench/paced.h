/* A paced device for chorus-bench-parallel: a backend wrapper whose kernels take the time a
 * device of a stated speed would, without holding a host core for it.
 *
 * Each kernel runs on the inner backend (the CPU's: the values are the real ones) and is
 * charged max(flops / flop_rate, bytes / byte_rate), from its arguments (GEMMs and attention
 * by their multiply-adds, every other kernel by the bytes it reads and writes). Inside one
 * of the trainer's timed intervals (backend.h's timer_mark: a pipeline pass, the optimizer's
 * update) the charges add up, and the interval's end waits, asleep, until its start plus
 * their sum; a kernel outside any interval waits for its own charge. So a rank's pass lasts
 * as long on the device as its arithmetic says, whatever else the host's cores are doing,
 * as long as the real kernels finish inside that time: the host computes a fraction
 * (paced_stats: busy over paced) of each interval and sleeps the rest, as a host does while
 * its GPU works. An interval whose real kernels overran it is counted late.
 *
 * What it is for: the pipeline schedules' bubble with one device per stage, which two cores
 * cannot give four CPU ranks. It measures the schedule, the point-to-point messages and the
 * host's part of each pass, not the kernels' speed. Not thread-safe: one per rank, driven
 * from that rank's thread. */
#ifndef CHORUS_BENCH_PACED_H
#define CHORUS_BENCH_PACED_H

#include <stdint.h>

#include "workerd/engine/backend.h"

typedef struct paced_stats {
    uint64_t intervals; /* closed timed intervals and kernels paced alone */
    uint64_t late;      /* of those, the ones whose real kernels ran past their charge */
    uint64_t late_ns;   /* by how much in all: time the host, not the device, set */
    uint64_t busy_ns;   /* host time inside the inner kernels */
    uint64_t paced_ns;  /* the charges: the device's time */
    double flops;       /* charged multiply-adds x 2 */
} paced_stats_t;

/* *out wraps inner (borrowed, must outlive it): flop_rate in FLOP/s, byte_rate in bytes/s.
 * 0 or -ENOMEM. */
int paced_create(const eng_backend_t *inner, double flop_rate, double byte_rate,
                 eng_backend_t **out);
void paced_destroy(eng_backend_t *be);
/* Counts since create or the last reset. */
void paced_stats(const eng_backend_t *be, paced_stats_t *out);
void paced_reset(eng_backend_t *be);

#endif

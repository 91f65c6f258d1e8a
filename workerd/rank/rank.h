/* The rank runtime: what a job kind sees inside one rank process.
 *
 * A rank process is chorus-rank, the binary next to workerd (DESIGN §1). It inherits a
 * socketpair to its workerd (plain session, same framing), reads its identity from the
 * torchrun-compatible environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * CHORUS_JOB, CHORUS_GENERATION) and the job file from CHORUS_JOB_FILE, then runs the
 * job kind's entry point. Every report goes to workerd, which relays it to coordinatord. */
#ifndef WRK_RANK_H
#define WRK_RANK_H

#include <stddef.h>
#include <stdint.h>

#include "common/client.h"
#include "common/jobspec.h"
#include "common/rdzv.h"

typedef struct wrk_rank {
    char job_id[64];
    uint64_t generation;
    uint32_t rank, world_size, local_rank, local_world_size;
    uint32_t threads;     /* CHORUS_THREADS: compute threads; 0: not set */
    uint64_t resume_step; /* 0: fresh start; else resume from this committed step */
    ch_jobspec_t spec;
    char run_dir[CH_PATH_LEN];    /* this rank's scratch directory (exists) */
    ch_client_t *link;            /* to workerd; owned by the runtime */
    char agent_sock[CH_PATH_LEN]; /* CHORUS_AGENT_SOCK: redialled when link closes; "": none */
    uint64_t relink_grace_ms;     /* how long to redial before giving up (exiting) */
    ch_rdzv_t rdzv;               /* rendezvous store, relayed through workerd */
    ch_device_t device;           /* workerd --device (CHORUS_DEVICE); cuda: GPU = local_rank */
    char detail[256];             /* why the kind failed (wrk_rank_fail); "" if not given */
    char timeout_group[32];       /* a collective wait timed out in this group ("" if not) */
    uint32_t timeout_peer;        /* waiting for this world rank */
    uint64_t progress_ms;         /* monotonic: when the last RANK_PROGRESS went out */
    uint64_t progress_names;      /* a hash of the metric names it carried */
    uint64_t timeout_seq;         /* in its collective number timeout_seq */
    /* collectives entered per group at the failure (wrk_coll_group_entered) */
    struct {
        const char *group; /* "tp", "dp", "pp", "emb" */
        uint64_t entered;
    } entered[4];
    uint32_t n_entered;
    int stepped;              /* a training step completed in this process */
    const char *cause_class;  /* the failure's class when the kind knows it (static
                                 string; NULL: ch_err_lasting of the code) */
    uint64_t nonfinite_batch; /* 1 + the data batch of a step whose loss was not finite */
    /* CHORUS_MEMORY_DIR (workerd --memory-dir; "": none), CHORUS_NODE (the node's name; "":
     * unknown), and where the kind resumed from: "memory" | "disk" until its first report
     * says so; NULL: a fresh start */
    char memory_dir[CH_PATH_LEN];
    char node[256];
    const char *resume_source;
} wrk_rank_t;

/* wrk_rank_progress reports at most once per this many ms: a tiny diag job running
 * thousands of rounds a second would otherwise flood workerd and the coordinator with
 * reports nobody reads. Its last round, and a report naming other metrics than the last
 * one sent (which no later report would repeat), always go out. */
#define WRK_RANK_PROGRESS_MIN_MS 50

/* chorus-rank's main (rank/main.c): returns the exit status. */
int wrk_rank_main(int argc, char **argv);
/* chorus-rank's main when argv[1] is "--evaluate" (evalproc.h): the evaluation child. */
int wrk_rank_eval_main(int argc, char **argv);

/* Record why the kind is failing (appended to the RANK_FAILED message after
 * ch_strerror(rc), and logged) and return rc:
 *     return wrk_rank_fail(r, CH_E_NUMERIC, "round %d: product differs", i); */
int wrk_rank_fail(wrk_rank_t *r, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Send one event; fills in job_id, generation and rank. */
int wrk_rank_report(wrk_rank_t *r, Chorus__RankEvent *ev);
/* Convenience: a RANK_PROGRESS event (the diag kinds' rounds). metrics may be NULL when
 * n == 0. Within WRK_RANK_PROGRESS_MIN_MS of the previous one it is left out (returns 0)
 * unless it is the last step or names other metrics. (A training step reports through
 * wrk_rank_report, every step: the status page draws each step's loss.) */
int wrk_rank_progress(wrk_rank_t *r, uint64_t step, uint64_t total, double loss,
                      double tokens_per_s, double mfu, Chorus__Metric **metrics, size_t n);

/* 1 when workerd relayed a checkpoint request (CheckpointRanks) for this rank's job and
 * generation since the last call; never waits. Other messages are dropped. */
int wrk_rank_poll_checkpoint(wrk_rank_t *r);

/* Fill ev's placed fields for a training rank (RANK_STARTED): its coordinates in the
 * layout, its stage's blocks (ch_layout_stage_blocks), its ZeRO-3 shard (coord_dp of dp)
 * and the parameters it owns (common/plan.h `owned`). Leaves ev alone for other kinds. */
void wrk_rank_place(const wrk_rank_t *r, Chorus__RankEvent *ev);

/* 1 when this rank computes on a GPU: the job's train.device is cuda, or (diag jobs, which
 * check the node) workerd runs it with --device cuda. */
int wrk_rank_on_gpu(const wrk_rank_t *r);
/* The GPU of a rank that computes on CUDA: LOCAL_RANK as an ordinal among the GPUs
 * CUDA_VISIBLE_DEVICES leaves visible, or the only visible one when the node pins each rank
 * to its own. `what` names the setting asking (e.g. "train.device") in the message. 0;
 * CH_E_CONFIG with err "<what>: cuda requested but this build has no CUDA backend" or
 * "... but no GPU visible"; -ENODEV when LOCAL_RANK has no GPU of its own and the ranks do
 * not share GPUs (wrk_rank_gpu_shared). */
int wrk_rank_gpu(const wrk_rank_t *r, const char *what, int *device, char *err, size_t errlen);
/* 1 when this GPU rank's collectives go host-staged (coll.h: wrk_coll_stage_t, over the
 * same-host shm/UCX backend) instead of NCCL: CHORUS_COLL_STAGED=1 forces it and =0 forbids
 * it; otherwise when the node runs more ranks than it sees GPUs (LOCAL_WORLD_SIZE above the
 * visible count), so that ranks share a GPU, which NCCL refuses. Then wrk_rank_gpu gives
 * rank LOCAL_RANK the GPU LOCAL_RANK mod count. */
int wrk_rank_gpu_shared(const wrk_rank_t *r);

/* Job kinds. Each returns 0 when the rank finished its work, else a negative code
 * (the runtime reports RANK_FAILED with ch_strerror and exits non-zero). */
int wrk_diag_run(wrk_rank_t *r);      /* workerd/rank/diag.c: GEMM self-check */
int wrk_diag_coll_run(wrk_rank_t *r); /* workerd/rank/diag_coll.c: collective checks */
int wrk_train_run(wrk_rank_t *r);     /* workerd/rank/train.c: the training engine */

#endif

/* In-memory peer checkpoints (memckpt.h).
 *
 * Theory of operation
 * - Save. Every memory_every steps each rank writes every piece it holds
 *   (eng_trainer_save_own: a one-shard committed step that restores this rank alone) under
 *   its node's memory dir (workerd --memory-dir, a tmpfs: it survives the rank, not the
 *   node): MEM/<job id>/<run id>/<tp>x<pp>x<dp>/r<rank>/<job name>/step-<8 digits>/. It sends
 *   the step's two files (shard and manifest) to its buddy, a rank on another node, which
 *   writes them under the same path on its own node. Each path keeps its newest
 *   WRK_MEMCKPT_KEEP steps: a rank killed while writing a step leaves the one before whole
 *   (a step counts once its manifest is there, written last).
 * - Transfer: over the ranks' own collectives (one world group, point-to-point), not
 *   through workerd. The data plane already joins every pair of ranks (UCX, NCCL) at the
 *   network's speed; tensors stay off the control plane (DESIGN §1) and out of workerd,
 *   which links no transport and must outlive every rank crash.
 * - Buddy: the job's nodes in the order of their lowest rank (told apart by a hash of
 *   CHORUS_NODE, gathered once); the i-th rank of node n copies to the (i mod count)-th rank
 *   of node n + 1 (mod nodes). A lost node's ranks all have copies on the next node, and
 *   that node's own copies are on the node after it, so losing one node loses no state.
 *   One node: no buddy, its own copies only (they survive ranks, not the node).
 * - Restore (a restart): each rank lists the steps its node holds of every rank's state;
 *   the lists are gathered and every rank computes the same newest step c held, for every
 *   rank, on some node. If c is at least the coordinator's disk step, each rank whose node
 *   lacks its own state at c receives it from the lowest-numbered rank whose node has it,
 *   and every rank restores from its node's copy (the rank's own layout: no resharding);
 *   a rank that fails makes every rank fall back to the disk. Otherwise: the disk.
 *   The gathered lists are world x world x KEEP steps: fine for the hundreds of ranks CI
 *   and a rack run, to be replaced by per-node lists beyond that. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "workerd/engine/ckpt_file.h"
#include "workerd/rank/memckpt.h"

#define KEEP       WRK_MEMCKPT_KEEP
#define GROUP_ID   (WRK_COLL_GROUP_CUSTOM + 1)
#define PACK_MAGIC 0x6368726d656d3031ull /* "chrmem01" */
#define PACK_HDR   4                     /* u64s: magic, step, rank, shard bytes */
#define MAX_FILE   ((size_t)1 << 40)

struct wrk_memckpt {
    wrk_rank_t *r;
    wrk_coll_t *c;
    wrk_coll_group_t *g; /* the world, member i = rank i; NULL for one rank */
    char base[CH_PATH_LEN];
    uint32_t world, rank;
    int64_t buddy;  /* -1: none */
    uint32_t *from; /* the ranks whose buddy this rank is */
    uint32_t nfrom;
};

/* One message of an exchange: a host buffer to send to, or received from, peer. */
typedef struct msg {
    uint32_t peer;
    uint8_t *buf; /* malloc'd */
    size_t len;
} msg_t;

static void msgs_free(msg_t *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i].buf);
    free(v);
}

// ----------------------------------------------------------------------------
// paths and files

static int rank_dir(const wrk_memckpt_t *m, uint32_t k, char *out, size_t len)
{
    int n = snprintf(out, len, "%s/r%u", m->base, k);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int step_dir(const wrk_memckpt_t *m, uint32_t k, uint64_t step, char *out, size_t len)
{
    char dir[CH_PATH_LEN];
    int rc = rank_dir(m, k, dir, sizeof dir);
    return rc < 0 ? rc : eng_ckpt_step_dir(dir, m->r->spec.name, step, out, len);
}

static int manifest_path(const char *sdir, char *out, size_t len)
{
    int n = snprintf(out, len, "%s/manifest.json", sdir);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* The newest KEEP committed steps of rank k's state on this node into steps[KEEP] (0: none),
 * newest first. */
static void list_steps(const wrk_memckpt_t *m, uint32_t k, uint64_t *steps)
{
    char dir[CH_PATH_LEN], job[CH_PATH_LEN], mf[CH_PATH_LEN + 320];
    memset(steps, 0, KEEP * sizeof *steps);
    if (rank_dir(m, k, dir, sizeof dir) < 0 ||
        snprintf(job, sizeof job, "%s/%s", dir, m->r->spec.name) >= (int)sizeof job)
        return;
    DIR *d = opendir(job);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        unsigned long long s;
        char tail;
        if (sscanf(e->d_name, "step-%llu%c", &s, &tail) != 1 || s == 0)
            continue;
        int n = snprintf(mf, sizeof mf, "%s/%s/manifest.json", job, e->d_name);
        if (n < 0 || (size_t)n >= sizeof mf || access(mf, R_OK) < 0)
            continue;                    /* not committed: a step being written, or cut short */
        for (int i = 0; i < KEEP; i++) { /* insert, newest first */
            if ((uint64_t)s == steps[i])
                break;
            if ((uint64_t)s > steps[i]) {
                memmove(&steps[i + 1], &steps[i], (KEEP - 1 - (size_t)i) * sizeof *steps);
                steps[i] = s;
                break;
            }
        }
    }
    closedir(d);
}

/* Rank k's step on this node as one message: magic, step, k, shard bytes, then the shard
 * and the manifest. */
static int pack(const wrk_memckpt_t *m, uint32_t k, uint64_t step, msg_t *out)
{
    char sdir[CH_PATH_LEN], shard[CH_PATH_LEN], mf[CH_PATH_LEN];
    char *sb = NULL, *mb = NULL;
    size_t sl = 0, ml = 0;
    int rc = step_dir(m, k, step, sdir, sizeof sdir);
    if (rc == 0)
        rc = eng_ckpt_shard_path(sdir, k, shard, sizeof shard);
    if (rc == 0)
        rc = manifest_path(sdir, mf, sizeof mf);
    if (rc == 0)
        rc = ch_file_read(shard, MAX_FILE, &sb, &sl);
    if (rc == 0)
        rc = ch_file_read(mf, MAX_FILE, &mb, &ml);
    if (rc < 0)
        goto out;
    out->len = PACK_HDR * sizeof(uint64_t) + sl + ml;
    if (!(out->buf = malloc(out->len))) {
        rc = -ENOMEM;
        goto out;
    }
    uint64_t hdr[PACK_HDR] = {PACK_MAGIC, step, k, sl};
    memcpy(out->buf, hdr, sizeof hdr);
    memcpy(out->buf + sizeof hdr, sb, sl);
    memcpy(out->buf + sizeof hdr + sl, mb, ml);
out:
    free(sb);
    free(mb);
    return rc;
}

/* Write a packed step under its rank's path on this node (shard first, the manifest last:
 * the step counts once whole), then prune that path to KEEP steps. */
static int unpack(const wrk_memckpt_t *m, const msg_t *in, uint64_t *step)
{
    uint64_t hdr[PACK_HDR];
    char sdir[CH_PATH_LEN], path[CH_PATH_LEN], dir[CH_PATH_LEN];
    if (in->len < sizeof hdr)
        return CH_E_FORMAT;
    memcpy(hdr, in->buf, sizeof hdr);
    if (hdr[0] != PACK_MAGIC || hdr[2] >= m->world || hdr[3] > in->len - sizeof hdr)
        return CH_E_FORMAT;
    uint32_t k = (uint32_t)hdr[2];
    const uint8_t *shard = in->buf + sizeof hdr, *mf = shard + hdr[3];
    size_t ml = in->len - sizeof hdr - hdr[3];
    *step = hdr[1];
    int rc = step_dir(m, k, hdr[1], sdir, sizeof sdir);
    if (rc == 0)
        rc = ch_mkdirs(sdir, 0700);
    if (rc == 0 && (rc = eng_ckpt_shard_path(sdir, k, path, sizeof path)) == 0)
        rc = ch_file_write_atomic(path, shard, hdr[3], 0600);
    if (rc == 0 && (rc = manifest_path(sdir, path, sizeof path)) == 0)
        rc = ch_file_write_atomic(path, mf, ml, 0600);
    if (rc == 0 && rank_dir(m, k, dir, sizeof dir) == 0 &&
        eng_ckpt_prune(dir, m->r->spec.name, KEEP) < 0)
        CH_LOGW("memckpt", "job=%s %s: pruning old steps failed", m->r->job_id, dir);
    return rc;
}

// ----------------------------------------------------------------------------
// transfers over the world group

/* Start count bytes to or from peer out of backend memory at d. */
static int start(wrk_memckpt_t *m, int send, uint32_t peer, uint8_t *d, size_t count,
                 wrk_coll_req_t **req)
{
    return send ? wrk_coll_send(m->g, d, count, WRK_COLL_U8, peer, req)
                : wrk_coll_recv(m->g, d, count, WRK_COLL_U8, peer, req);
}

/* One round: sends[i].len bytes to each send peer, recvs[i].len bytes from each receive
 * peer (lengths known), through one backend buffer. Received bytes land in recvs[i].buf
 * (malloc'd here). */
static int round_trip(wrk_memckpt_t *m, msg_t *sends, size_t ns, msg_t *recvs, size_t nr)
{
    size_t total = 0, n = ns + nr, done = 0;
    for (size_t i = 0; i < ns; i++)
        total += sends[i].len;
    for (size_t i = 0; i < nr; i++)
        total += recvs[i].len;
    uint8_t *d = NULL;
    wrk_coll_req_t **reqs = calloc(n ? n : 1, sizeof *reqs);
    int rc = reqs ? wrk_coll_mem_alloc(m->c, total ? total : 1, (void **)&d) : -ENOMEM;
    size_t at = 0;
    for (size_t i = 0; rc == 0 && i < ns; at += sends[i].len, i++)
        if ((rc = wrk_coll_mem_copy(m->c, d + at, sends[i].buf, sends[i].len, 1)) == 0)
            rc = start(m, 1, sends[i].peer, d + at, sends[i].len, &reqs[done++]);
    size_t recv_at = at;
    for (size_t i = 0; rc == 0 && i < nr; at += recvs[i].len, i++)
        rc = start(m, 0, recvs[i].peer, d + at, recvs[i].len, &reqs[done++]);
    for (size_t i = 0; i < done; i++) { /* wait even after a failed start: buffers are lent */
        int w = wrk_coll_wait(reqs[i], -1);
        rc = rc ? rc : w;
        wrk_coll_req_free(reqs[i]);
    }
    at = recv_at;
    for (size_t i = 0; rc == 0 && i < nr; at += recvs[i].len, i++) {
        if (!(recvs[i].buf = malloc(recvs[i].len ? recvs[i].len : 1)))
            rc = -ENOMEM;
        else
            rc = wrk_coll_mem_copy(m->c, recvs[i].buf, d + at, recvs[i].len, 0);
    }
    if (d)
        wrk_coll_mem_free(m->c, d);
    free(reqs);
    return rc;
}

/* Send each of sends to its peer and receive one message from each of recvs' peers (their
 * lengths unknown: the sizes go first). */
static int exchange(wrk_memckpt_t *m, msg_t *sends, size_t ns, msg_t *recvs, size_t nr)
{
    msg_t *ss = calloc(ns + 1, sizeof *ss), *rs = calloc(nr + 1, sizeof *rs);
    uint64_t *lens = calloc(ns + 1, sizeof *lens);
    int rc = ss && rs && lens ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < ns; i++) {
        lens[i] = sends[i].len;
        ss[i] = (msg_t){sends[i].peer, (uint8_t *)&lens[i], sizeof lens[i]};
    }
    for (size_t i = 0; rc == 0 && i < nr; i++)
        rs[i] = (msg_t){recvs[i].peer, NULL, sizeof(uint64_t)};
    if (rc == 0)
        rc = round_trip(m, ss, ns, rs, nr);
    for (size_t i = 0; rc == 0 && i < nr; i++) {
        uint64_t len;
        memcpy(&len, rs[i].buf, sizeof len);
        if (len > MAX_FILE)
            rc = CH_E_FORMAT;
        recvs[i].len = (size_t)len;
    }
    if (rc == 0)
        rc = round_trip(m, sends, ns, recvs, nr);
    for (size_t i = 0; rs && i < nr; i++)
        free(rs[i].buf);
    free(ss);
    free(rs);
    free(lens);
    return rc;
}

// ----------------------------------------------------------------------------
// buddies

/* Every rank's node as a hash of its name, gathered over the world. */
static int gather_nodes(wrk_memckpt_t *m, uint64_t *nodes)
{
    ch_hash64_t h;
    ch_hash64_init(&h);
    ch_hash64_update(&h, m->r->node, strlen(m->r->node));
    uint64_t mine = ch_hash64_final(&h);
    size_t one = sizeof mine, all = one * m->world;
    uint8_t *d = NULL;
    int rc = wrk_coll_mem_alloc(m->c, all, (void **)&d);
    if (rc < 0)
        return rc;
    rc = wrk_coll_mem_copy(m->c, d + one * m->rank, &mine, one, 1);
    if (rc == 0)
        rc = wrk_coll_allgather(m->g, d + one * m->rank, d, one, WRK_COLL_U8, NULL);
    if (rc == 0)
        rc = wrk_coll_mem_copy(m->c, nodes, d, all, 0);
    wrk_coll_mem_free(m->c, d);
    return rc;
}

static int pick_buddies(wrk_memckpt_t *m)
{
    uint64_t *nodes = calloc(m->world, sizeof *nodes);
    int64_t *buddy = calloc(m->world, sizeof *buddy);
    int rc = nodes && buddy ? gather_nodes(m, nodes) : -ENOMEM;
    if (rc == 0)
        rc = ch_plan_memckpt_buddies(nodes, m->world, buddy);
    if (rc == 0 && !(m->from = calloc(m->world, sizeof *m->from)))
        rc = -ENOMEM;
    for (uint32_t k = 0; rc == 0 && k < m->world; k++)
        if (buddy[k] == (int64_t)m->rank)
            m->from[m->nfrom++] = k;
    if (rc == 0)
        m->buddy = buddy[m->rank];
    free(nodes);
    free(buddy);
    return rc;
}

// ----------------------------------------------------------------------------
// the object

int wrk_memckpt_create(wrk_rank_t *r, wrk_coll_t *c, wrk_memckpt_t **out)
{
    const ch_jobspec_t *s = &r->spec;
    *out = NULL;
    if (s->checkpoint.memory_every <= 0 || !r->memory_dir[0])
        return 0;
    wrk_memckpt_t *m = calloc(1, sizeof *m);
    uint32_t *ranks = NULL;
    if (!m)
        return -ENOMEM;
    m->r = r;
    m->c = c;
    m->rank = r->rank;
    m->world = r->world_size;
    m->buddy = -1;
    /* the run id too: a job id that a coordinator with a fresh state hands out again must
     * not meet an older run's state */
    int n = snprintf(m->base, sizeof m->base, "%s/%s/%s/%ux%ux%u", r->memory_dir, r->job_id,
                     s->checkpoint.run_id[0] ? s->checkpoint.run_id : "norun", s->parallel.tp,
                     s->parallel.pp, s->parallel.dp);
    int rc = n < 0 || (size_t)n >= sizeof m->base ? -ENAMETOOLONG : ch_mkdirs(m->base, 0700);
    if (rc == 0 && c && m->world > 1) {
        if (!(ranks = calloc(m->world, sizeof *ranks)))
            rc = -ENOMEM;
        for (uint32_t i = 0; rc == 0 && i < m->world; i++)
            ranks[i] = i;
        if (rc == 0)
            rc = wrk_coll_group_create(c, "mem", GROUP_ID, ranks, m->world, &m->g);
        if (rc == 0)
            rc = pick_buddies(m);
    }
    free(ranks);
    if (rc < 0) {
        wrk_memckpt_destroy(m);
        return rc;
    }
    if (m->buddy < 0 && m->world > 1)
        CH_LOGW("memckpt",
                "job=%s rank=%u: every rank on node %s: in-memory checkpoints have "
                "no copy on another node (a lost node falls back to the disk)",
                r->job_id, r->rank, r->node);
    CH_LOGI("memckpt",
            "job=%s gen=%" PRIu64 " rank=%u: memory checkpoints every %" PRId64
            " steps in %s, copy on rank %" PRId64 ", holding copies of %u ranks",
            r->job_id, r->generation, r->rank, s->checkpoint.memory_every, m->base, m->buddy,
            m->nfrom);
    *out = m;
    return 0;
}

void wrk_memckpt_destroy(wrk_memckpt_t *m)
{
    if (!m)
        return;
    wrk_coll_group_destroy(m->g);
    free(m->from);
    free(m);
}

int wrk_memckpt_due(const wrk_memckpt_t *m, uint64_t done)
{
    int64_t every = m ? m->r->spec.checkpoint.memory_every : 0;
    return every > 0 && done > 0 && done % (uint64_t)every == 0;
}

int wrk_memckpt_save(wrk_memckpt_t *m, eng_trainer_t *t, char *err, size_t errlen)
{
    char dir[CH_PATH_LEN];
    uint64_t step = eng_trainer_next_step(t), got = 0;
    msg_t own = {0}, *in = NULL;
    int rc = rank_dir(m, m->rank, dir, sizeof dir);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: path too long", m->base);
    if ((rc = eng_trainer_save_own(t, dir, KEEP, err, errlen)) < 0 || !m->g)
        return rc;
    if (m->buddy >= 0 && (rc = pack(m, m->rank, step, &own)) < 0)
        return ch_errf(err, errlen, rc, "memory checkpoint of step %" PRIu64 ": %s", step,
                       ch_strerror(rc));
    own.peer = (uint32_t)(m->buddy >= 0 ? m->buddy : 0);
    if (!(in = calloc(m->nfrom + 1, sizeof *in))) {
        free(own.buf);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < m->nfrom; i++)
        in[i].peer = m->from[i];
    rc = exchange(m, &own, m->buddy >= 0, in, m->nfrom);
    for (uint32_t i = 0; rc == 0 && i < m->nfrom; i++)
        if ((rc = unpack(m, &in[i], &got)) == 0 && got != step)
            rc = CH_E_FORMAT;
    if (rc < 0)
        ch_errf(err, errlen, rc, "memory checkpoint of step %" PRIu64 ": copies: %s", step,
                ch_strerror(rc));
    msgs_free(in, m->nfrom);
    free(own.buf);
    return rc;
}

// ----------------------------------------------------------------------------
// restore

/* Whether step s of rank k is among the listed steps of reporter j. */
static int holds(const uint64_t *all, uint32_t world, uint32_t j, uint32_t k, uint64_t s)
{
    const uint64_t *v = all + ((size_t)j * world + k) * KEEP;
    for (int i = 0; i < KEEP; i++)
        if (s && v[i] == s)
            return 1;
    return 0;
}

/* The lowest rank whose node holds rank k's step s; -1: none. */
static int64_t holder(const uint64_t *all, uint32_t world, uint32_t k, uint64_t s)
{
    for (uint32_t j = 0; j < world; j++)
        if (holds(all, world, j, k, s))
            return j;
    return -1;
}

/* The newest step held of every rank's state on some node; 0: none. */
static uint64_t newest_complete(const uint64_t *all, uint32_t world)
{
    uint64_t best = 0;
    for (size_t i = 0; i < (size_t)world * world * KEEP; i++) {
        uint64_t s = all[i];
        if (s <= best)
            continue;
        uint32_t k = 0;
        while (k < world && holder(all, world, k, s) >= 0)
            k++;
        if (k == world)
            best = s;
    }
    return best;
}

/* Every rank's lists (this node's steps of every rank's state), gathered: all[j][k][KEEP]. */
static int gather_lists(wrk_memckpt_t *m, uint64_t *all)
{
    size_t one = (size_t)m->world * KEEP * sizeof *all;
    uint64_t *mine = all + (size_t)m->rank * m->world * KEEP;
    for (uint32_t k = 0; k < m->world; k++)
        list_steps(m, k, mine + (size_t)k * KEEP);
    if (!m->g)
        return 0;
    uint8_t *d = NULL;
    int rc = wrk_coll_mem_alloc(m->c, one * m->world, (void **)&d);
    if (rc < 0)
        return rc;
    rc = wrk_coll_mem_copy(m->c, d + one * m->rank, mine, one, 1);
    if (rc == 0)
        rc = wrk_coll_allgather(m->g, d + one * m->rank, d, one, WRK_COLL_U8, NULL);
    if (rc == 0)
        rc = wrk_coll_mem_copy(m->c, all, d, one * m->world, 0);
    wrk_coll_mem_free(m->c, d);
    return rc;
}

/* Step s of the ranks whose nodes lack it, from their holders. */
static int fetch_missing(wrk_memckpt_t *m, const uint64_t *all, uint64_t s)
{
    msg_t *out = calloc(m->world, sizeof *out), in = {0};
    size_t nout = 0;
    int need = !holds(all, m->world, m->rank, m->rank, s), rc = out ? 0 : -ENOMEM;
    for (uint32_t k = 0; rc == 0 && k < m->world; k++) {
        if (holds(all, m->world, k, k, s) || holder(all, m->world, k, s) != (int64_t)m->rank)
            continue;
        out[nout].peer = k;
        rc = pack(m, k, s, &out[nout++]);
    }
    if (need)
        in.peer = (uint32_t)holder(all, m->world, m->rank, s);
    if (rc == 0 && m->g)
        rc = exchange(m, out, nout, &in, (size_t)need);
    uint64_t got = 0;
    if (rc == 0 && need && (rc = unpack(m, &in, &got)) == 0 && got != s)
        rc = CH_E_FORMAT;
    msgs_free(out, nout);
    free(in.buf);
    return rc;
}

/* Every rank's outcome: 1 when any rank failed. */
static int any_failed(wrk_memckpt_t *m, int failed, int *any)
{
    *any = failed;
    if (!m->g)
        return 0;
    float f = failed ? 1.0f : 0.0f, *d = NULL;
    int rc = wrk_coll_mem_alloc(m->c, sizeof f, (void **)&d);
    if (rc == 0 && (rc = wrk_coll_mem_copy(m->c, d, &f, sizeof f, 1)) == 0 &&
        (rc = wrk_coll_allreduce(m->g, d, d, 1, WRK_COLL_F32, WRK_COLL_MAX, NULL)) == 0)
        rc = wrk_coll_mem_copy(m->c, &f, d, sizeof f, 0);
    if (d)
        wrk_coll_mem_free(m->c, d);
    *any = f != 0.0f;
    return rc;
}

int wrk_memckpt_restore(wrk_memckpt_t *m, eng_trainer_t *t, uint64_t min_step, uint64_t *step,
                        char *err, size_t errlen)
{
    char sdir[CH_PATH_LEN];
    size_t n = (size_t)m->world * m->world * KEEP;
    uint64_t *all = calloc(n, sizeof *all);
    *step = 0;
    int rc = all ? gather_lists(m, all) : -ENOMEM, any = 0;
    if (rc < 0) {
        rc = ch_errf(err, errlen, rc, "memory checkpoints: gathering what the nodes hold: %s",
                     ch_strerror(rc));
        goto out;
    }
    uint64_t s = newest_complete(all, m->world);
    if (s == 0 || s < min_step) {
        CH_LOGI("memckpt",
                "job=%s gen=%" PRIu64 " rank=%u: newest step whole in memory %" PRIu64
                ", disk %" PRIu64 ": reading the disk",
                m->r->job_id, m->r->generation, m->rank, s, min_step);
        goto out;
    }
    err[0] = '\0';
    rc = fetch_missing(m, all, s);
    if (rc < 0)
        ch_errf(err, errlen, rc, "memory checkpoint of step %" PRIu64 ": fetching: %s", s,
                ch_strerror(rc));
    if (rc == 0 && (rc = step_dir(m, m->rank, s, sdir, sizeof sdir)) == 0)
        rc = eng_trainer_resume_dir(t, sdir, err, errlen);
    int arc = any_failed(m, rc < 0, &any);
    if (rc == 0 && arc < 0)
        rc = ch_errf(err, errlen, arc, "memory checkpoints: agreeing: %s", ch_strerror(arc));
    else if (rc == 0 && any)
        rc = ch_errf(err, errlen, CH_E_STATE,
                     "another rank could not restore step %" PRIu64 " from memory", s);
    if (rc == 0)
        *step = s;
out:
    free(all);
    return rc;
}

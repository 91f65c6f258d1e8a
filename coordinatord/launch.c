/* Launch tokens; see launch.h. */
#include "launch.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "coord.h"

int coord_launch_init(coord_t *c)
{
    char path[PATH_MAX];
    if (!c->cfg.launch_tokens)
        return 0;
    if (snprintf(path, sizeof path, "%s/launch.key", c->cfg.state_dir) >= (int)sizeof path)
        return -ENAMETOOLONG;
    int rc = ch_key_load(path, &c->launch_key);
    if (rc == -ENOENT && (rc = ch_key_generate(path)) == 0)
        rc = ch_key_load(path, &c->launch_key);
    if (rc < 0)
        CH_LOGE("main", "launch key %s: %s", path, ch_strerror(rc));
    return rc;
}

uint64_t coord_launch_token(const coord_t *c, const char *job_id, uint64_t gen, const char *node)
{
    char msg[256];
    if (!c->cfg.launch_tokens)
        return 0;
    int n = snprintf(msg, sizeof msg, "launch|%s|%llu|%s", job_id ? job_id : "",
                     (unsigned long long)gen, node ? node : "");
    if (n < 0)
        n = 0;
    uint64_t t =
        ch_auth_mac64(&c->launch_key, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg);
    return t ? t : 1; /* 0 means "none" on the wire */
}

int coord_launch_ok(const coord_t *c, const char *job_id, uint64_t gen, coord_node_t *node,
                    uint64_t token)
{
    if (!c->cfg.launch_tokens)
        return 1;
    if (!node || token == 0)
        return 0;
    if (!job_id)
        job_id = "";
    /* The token is a function of the key (fixed while we run), job, gen and node: one
     * found right stays right. Only right ones are remembered. */
    if (token == node->tok && gen == node->tok_gen && strcmp(job_id, node->tok_job) == 0)
        return 1;
    /* not secret-dependent timing worth hiding: the compare is of a 64-bit tag per event,
     * and a wrong guess only gets the event dropped */
    if (coord_launch_token(c, job_id, gen, node->name) != token)
        return 0;
    if (strlen(job_id) < sizeof node->tok_job) {
        memcpy(node->tok_job, job_id, strlen(job_id) + 1);
        node->tok_gen = gen;
        node->tok = token;
    }
    return 1;
}

/* Keep the refs of n whose token is right; *kept malloc'd. */
static int filter(const coord_t *c, coord_node_t *node, Chorus__RankRef **refs, size_t n,
                  Chorus__RankRef ***kept, size_t *n_kept, size_t *refused)
{
    *kept = malloc((n ? n : 1) * sizeof **kept);
    *n_kept = 0;
    if (!*kept)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (coord_launch_ok(c, refs[i]->job_id, refs[i]->generation, node, refs[i]->launch_token))
            (*kept)[(*n_kept)++] = refs[i];
        else
            (*refused)++;
    }
    return 0;
}

int coord_launch_register(const coord_t *c, coord_node_t *node, const Chorus__Register *reg,
                          Chorus__Register *out, size_t *refused)
{
    *out = *reg;
    out->running = out->finished = NULL;
    *refused = 0;
    int rc = filter(c, node, reg->running, reg->n_running, &out->running, &out->n_running, refused);
    if (rc == 0)
        rc = filter(c, node, reg->finished, reg->n_finished, &out->finished, &out->n_finished,
                    refused);
    if (rc < 0)
        coord_launch_register_free(out);
    return rc;
}

void coord_launch_register_free(Chorus__Register *r)
{
    free(r->running);
    free(r->finished);
    r->running = r->finished = NULL;
}

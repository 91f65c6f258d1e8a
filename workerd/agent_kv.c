/* The agent's rendezvous relay (agent.h's theory of operation): a rank's KvSet/KvGet goes
 * to the coordinator under a fresh request id, and the reply is routed back under the
 * rank's own id. */
#include <errno.h>
#include <stdlib.h>

#include "common/err.h"
#include "common/rdzv.h"
#include "common/util.h"
#include "workerd/agent_impl.h"

void wrk_agent_relay_remove(wrk_agent_t *a, kv_relay_t **pp)
{
    kv_relay_t *k = *pp;
    *pp = k->next;
    free(k);
    (void)a;
}

void wrk_agent_reply_rank_code(rank_ent_t *ent, uint64_t rank_id, int code)
{
    Chorus__KvReply kr = CHORUS__KV_REPLY__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    if (!ent->link)
        return;
    kr.code = code;
    env.request_id = rank_id;
    env.body_case = CHORUS__ENVELOPE__BODY_KV_REPLY;
    env.kv_reply = &kr;
    ch_conn_send(ent->link, &env);
}

void wrk_agent_relays_fail(wrk_agent_t *a, rank_ent_t *ent, int code)
{
    kv_relay_t **pp = &a->relays;
    while (*pp) {
        if (ent && (*pp)->ent != ent) {
            pp = &(*pp)->next;
            continue;
        }
        if (code)
            wrk_agent_reply_rank_code((*pp)->ent, (*pp)->rank_id, code);
        wrk_agent_relay_remove(a, pp);
    }
}

void wrk_agent_relay_kv(wrk_agent_t *a, rank_ent_t *ent, Chorus__Envelope *env)
{
    uint32_t timeout_ms = 0;
    char **job_field;
    int rc;
    /* The rank's (job, generation) are forced to its own. The job string belongs to the
     * decoded message: ours is borrowed for the send and theirs put back . */
    if (env->body_case == CHORUS__ENVELOPE__BODY_KV_SET) {
        Chorus__KvSet *ks = env->kv_set;
        if (ks->value.len > CH_RDZV_VALUE_MAX) {
            wrk_agent_reply_rank_code(ent, env->request_id, CH_E_TOOBIG);
            return;
        }
        job_field = &ks->job_id;
        ks->generation = ent->gen;
    } else {
        Chorus__KvGet *kg = env->kv_get;
        job_field = &kg->job_id;
        kg->generation = ent->gen;
        timeout_ms = kg->timeout_ms;
    }
    if (!a->registered) {
        wrk_agent_reply_rank_code(ent, env->request_id, -ENOTCONN);
        return;
    }
    kv_relay_t *k = calloc(1, sizeof *k);
    if (!k) {
        wrk_agent_reply_rank_code(ent, env->request_id, -ENOMEM);
        return;
    }
    k->id = ++a->next_request_id;
    k->rank_id = env->request_id;
    k->ent = ent;
    k->expire_ms = ch_now_ms() + timeout_ms + KV_EXPIRE_MARGIN_MS;
    /* env is borrowed from the rank link's callback: rewrite in place, send, restore. */
    uint64_t rank_id = env->request_id;
    char *their_job = *job_field;
    env->request_id = k->id;
    *job_field = ent->job_id;
    rc = wrk_agent_coord_send(a, env);
    *job_field = their_job;
    env->request_id = rank_id;
    if (rc < 0) {
        free(k);
        wrk_agent_reply_rank_code(ent, rank_id, -ENOTCONN);
        return;
    }
    k->next = a->relays;
    a->relays = k;
}

int wrk_agent_route_reply(wrk_agent_t *a, Chorus__Envelope *env)
{
    if (env->request_id == 0)
        return 0;
    for (kv_relay_t **pp = &a->relays; *pp; pp = &(*pp)->next) {
        kv_relay_t *k = *pp;
        if (k->id != env->request_id)
            continue;
        if (k->ent->link) {
            uint64_t id = env->request_id;
            env->request_id = k->rank_id;
            ch_conn_send(k->ent->link, env);
            env->request_id = id;
        }
        wrk_agent_relay_remove(a, pp);
        return 1;
    }
    return 0;
}

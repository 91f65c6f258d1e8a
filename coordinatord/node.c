/* Node registry; see node.h. */
#include "node.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "coord.h"

static const char *const STATE_NAMES[COORD_NODE_NSTATES] = {"alive", "suspect", "dead", "draining"};

const char *coord_node_state_name(coord_node_state_t s)
{
    return s < COORD_NODE_NSTATES ? STATE_NAMES[s] : "?";
}

// ---------------------------------------------------------------------------------------
// The name index: a registration storm of N nodes costs O(N), not O(N^2)

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* The slot holding name, else the empty slot where it would go. ix_cap > 0. */
static size_t ix_slot(const coord_nodes_t *ns, const char *name)
{
    size_t mask = ns->ix_cap - 1, i = (size_t)name_hash(name) & mask;
    while (ns->ix[i] && strcmp(ns->ix[i]->name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

/* (Re)build the index over v with room for want nodes, at most half full. */
static int ix_build(coord_nodes_t *ns, size_t want)
{
    size_t cap = 64;
    while (cap < 2 * want)
        cap *= 2;
    coord_node_t **ix = calloc(cap, sizeof(*ix));
    if (!ix)
        return -ENOMEM;
    free(ns->ix);
    ns->ix = ix;
    ns->ix_cap = cap;
    for (size_t i = 0; i < ns->n; i++)
        ns->ix[ix_slot(ns, ns->v[i]->name)] = ns->v[i];
    return 0;
}

coord_node_t *coord_node_find(coord_t *c, const char *name)
{
    const coord_nodes_t *ns = &c->nodes;
    return ns->ix_cap ? ns->ix[ix_slot(ns, name)] : NULL;
}

static coord_node_t *add(coord_t *c, const char *name)
{
    coord_nodes_t *ns = &c->nodes;
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? ns->cap * 2 : 16;
        coord_node_t **v = realloc(ns->v, cap * sizeof(*v));
        if (!v)
            return NULL;
        ns->v = v;
        ns->cap = cap;
    }
    if (2 * (ns->n + 1) > ns->ix_cap && ix_build(ns, ns->n + 1) < 0)
        return NULL;
    coord_node_t *n = calloc(1, sizeof(*n));
    if (!n)
        return NULL;
    snprintf(n->name, sizeof(n->name), "%s", name);
    n->state = COORD_NODE_DEAD;
    n->dead_since_ms = ch_now_ms();
    ns->v[ns->n++] = n;
    ns->ix[ix_slot(ns, n->name)] = n;
    return n;
}

coord_node_t *coord_node_get(coord_t *c, const char *name)
{
    coord_node_t *n = coord_node_find(c, name);
    return n ? n : add(c, name);
}

uint32_t coord_node_free(const coord_node_t *n)
{
    if (n->state != COORD_NODE_ALIVE || n->drained || n->used >= n->slots)
        return 0;
    return n->slots - n->used;
}

static void store_node(coord_t *c, const coord_node_t *n)
{
    coord_node_rec_t rec = {
        .name = n->name,
        .state = coord_node_state_name(n->state),
        .rack = n->rack,
        .device = ch_device_name(n->device),
        .slots = n->slots,
        .updated_ms = ch_wall_ms(),
    };
    coord_store_node_put(c->store, &rec); /* failure already logged by the store */
}

/* The one place a node changes state: log, store, tell the jobs and the scheduler. */
static void set_state(coord_t *c, coord_node_t *n, coord_node_state_t to, const char *why)
{
    char what[192];
    if (n->state == to)
        return;
    coord_node_state_t from = n->state;
    n->state = to;
    snprintf(what, sizeof(what), "state %s->%s (%s)", coord_node_state_name(from),
             coord_node_state_name(to), why);
    if (to == COORD_NODE_DEAD)
        CH_LOGW("node", "node=%s %s", n->name, what);
    else
        CH_LOGI("node", "node=%s %s", n->name, what);
    store_node(c, n);
    coord_event(c, NULL, 0, -1, n->name, what);
    if (to == COORD_NODE_DEAD) {
        n->dead_since_ms = ch_now_ms();
        coord_job_node_dead(c, n, why);
    }
    coord_changed(c);
}

/* Printable ASCII only (lo..0x7e): names and racks go into log lines, tables and JSON. */
static int printable(const char *s, char lo)
{
    for (; *s; s++)
        if (*s < lo || *s > 0x7e)
            return 0;
    return 1;
}

int coord_node_register(coord_t *c, coord_link_t *link, const Chorus__Register *reg,
                        coord_node_t **out, char *err, size_t errlen)
{
    const char *name = reg->name ? reg->name : "";
    const char *rack = reg->rack ? reg->rack : "";
    ch_device_t device = CH_DEVICE_CPU; /* an old workerd sends none */
    size_t len = strlen(name);

    *out = NULL;
    if (len == 0 || len >= sizeof(((coord_node_t *)0)->name) || strchr(name, ':') ||
        strchr(name, ',') || !printable(name, 0x21)) {
        snprintf(err, errlen,
                 "register: bad node name (1..63 printable characters, no space, ':' or ',')");
        return CH_E_CONFIG;
    }
    if (strlen(rack) >= sizeof(((coord_node_t *)0)->rack) || !printable(rack, 0x20)) {
        snprintf(err, errlen, "register: node %s: bad rack (0..63 printable characters)", name);
        return CH_E_CONFIG;
    }
    if (reg->device && *reg->device && ch_device_parse(reg->device, &device) < 0) {
        snprintf(err, errlen, "register: node %s: bad device (cpu or cuda)", name);
        return CH_E_CONFIG;
    }
    if (reg->slots == 0 || reg->slots > COORD_NODE_SLOTS_MAX) {
        snprintf(err, errlen, "register: node %s: slots %u out of range 1..%u", name, reg->slots,
                 COORD_NODE_SLOTS_MAX);
        return CH_E_CONFIG;
    }
    if (reg->n_running > COORD_NODE_RUNNING_MAX(reg->slots)) {
        snprintf(err, errlen,
                 "register: node %s: %zu running ranks reported for %u slots (at most %u)", name,
                 reg->n_running, reg->slots, COORD_NODE_RUNNING_MAX(reg->slots));
        return CH_E_CONFIG;
    }
    if (reg->n_finished > COORD_NODE_RUNNING_MAX(reg->slots)) {
        snprintf(err, errlen,
                 "register: node %s: %zu finished ranks reported for %u slots (at most %u)", name,
                 reg->n_finished, reg->slots, COORD_NODE_RUNNING_MAX(reg->slots));
        return CH_E_CONFIG;
    }
    /* One link is one node: a second identity on a registered link is refused (its
     * node would be left pointing at the link once it closes). */
    if (link->node && strcmp(link->node->name, name) != 0) {
        snprintf(err, errlen, "register: this link is node %s; it cannot also be %s",
                 link->node->name, name);
        return CH_E_STATE;
    }
    coord_node_t *n = coord_node_find(c, name);
    /* A live node's name is not taken over: the new link waits (workerd retries) until
     * the old one is gone — closed, or cut when the node is declared dead. */
    if (n && n->link && n->link != link) {
        snprintf(err, errlen,
                 "register: node name %s is in use by a live link (%s); a restarted node gets "
                 "it back once that link is gone",
                 name, coord_link_peer(n->link));
        return -EADDRINUSE;
    }
    if (!n)
        n = coord_node_get(c, name);
    if (!n) {
        snprintf(err, errlen, "register: out of memory");
        return -ENOMEM;
    }
    n->link = link;
    link->node = n;
    snprintf(n->rack, sizeof(n->rack), "%s", rack);
    n->device = device;
    n->slots = reg->slots;
    n->memory_bytes = reg->memory_bytes;
    n->progress_ms = reg->progress_ms;
    n->last_hb_ms = ch_now_ms();
    n->last_hb_wall = ch_wall_ms();
    if (n->state == COORD_NODE_ALIVE) {
        store_node(c, n); /* slots or rack may have changed */
        coord_changed(c);
    } else {
        char why[96];
        snprintf(why, sizeof(why), "registered, %u slots, rack \"%s\"", n->slots, n->rack);
        set_state(c, n, COORD_NODE_ALIVE, why);
    }
    *out = n;
    return 0;
}

const char *coord_node_shown_state(const coord_node_t *n)
{
    if (n->drained && n->state == COORD_NODE_ALIVE)
        return coord_node_state_name(COORD_NODE_DRAINING);
    return coord_node_state_name(n->state);
}

int coord_node_drain(coord_t *c, const char *name, int on, const char *reason, char *err,
                     size_t errlen)
{
    coord_node_t *n = coord_node_find(c, name);
    if (!n)
        return ch_errf(err, errlen, CH_E_NOTFOUND, "no node \"%.64s\"", name);
    n->drained = on;
    snprintf(n->drain_reason, sizeof n->drain_reason, "%s", on && reason ? reason : "");
    CH_LOGI("node", "node=%s %s%s%s", n->name, on ? "drained" : "resumed",
            on && reason && *reason ? ": " : "", on && reason ? reason : "");
    coord_changed(c); /* a resumed node may start queued jobs */
    return 0;
}

void coord_node_heard(coord_t *c, coord_node_t *n)
{
    n->last_hb_ms = coord_turn_ms(c);
    n->last_hb_wall = coord_turn_wall_ms(c);
    if (n->state == COORD_NODE_SUSPECT && n->link)
        set_state(c, n, COORD_NODE_ALIVE, "heartbeat");
}

void coord_node_heartbeat(coord_t *c, coord_node_t *n, const Chorus__Heartbeat *hb)
{
    /* Heartbeat carries the node's clock and free slots; neither is used here (slots are
     * counted from the placement), so any message of the node does what it does. */
    (void)hb;
    c->heartbeats_total++;
    coord_node_heard(c, n);
}

void coord_node_link_closed(coord_t *c, coord_node_t *n)
{
    n->link = NULL;
    if (n->state == COORD_NODE_ALIVE || n->state == COORD_NODE_DRAINING)
        set_state(c, n, COORD_NODE_SUSPECT, "connection closed");
}

// ---------------------------------------------------------------------------------------
// Forgetting nodes

/* Mark every node a job's placement points at: active_stamp for active jobs, else
 * done_stamp (unless already marked active). O(ranks of all jobs). */
static void mark_referenced(coord_t *c, uint64_t active_stamp, uint64_t done_stamp)
{
    for (size_t i = 0; i < c->jobs.n; i++) {
        const coord_job_t *j = c->jobs.v[i];
        int active = coord_job_is_active(j);
        for (uint32_t r = 0; j->ranks && r < j->world; r++) {
            coord_node_t *n = j->ranks[r].node;
            if (!n)
                continue;
            if (active)
                n->mark = active_stamp;
            else if (n->mark != active_stamp)
                n->mark = done_stamp;
        }
    }
}

/* Take nodes.v[i] off the registry and the store; keep its memory while a finished
 * job's placement points at it. */
static int drop(coord_t *c, size_t i, int referenced, const char *why)
{
    coord_node_t *n = c->nodes.v[i];
    if (referenced && c->nodes.n_gone == c->nodes.cap_gone) {
        size_t cap = c->nodes.cap_gone ? c->nodes.cap_gone * 2 : 16;
        coord_node_t **v = realloc(c->nodes.gone, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        c->nodes.gone = v;
        c->nodes.cap_gone = cap;
    }
    CH_LOGI("node", "node=%s forgotten (%s)", n->name, why);
    coord_store_node_delete(c->store, n->name); /* failure already logged by the store */
    coord_event(c, NULL, 0, -1, n->name, "forgotten");
    memmove(&c->nodes.v[i], &c->nodes.v[i + 1], (c->nodes.n - i - 1) * sizeof(*c->nodes.v));
    c->nodes.n--;
    /* Linear probing has no cheap delete: rebuild (same size, cannot fail to fit). */
    memset(c->nodes.ix, 0, c->nodes.ix_cap * sizeof(*c->nodes.ix));
    for (size_t k = 0; k < c->nodes.n; k++)
        c->nodes.ix[ix_slot(&c->nodes, c->nodes.v[k]->name)] = c->nodes.v[k];
    if (referenced)
        c->nodes.gone[c->nodes.n_gone++] = n;
    else
        free(n);
    coord_changed(c);
    return 0;
}

int coord_node_forget(coord_t *c, const char *name, char *err, size_t errlen)
{
    size_t i = 0;
    while (i < c->nodes.n && strcmp(c->nodes.v[i]->name, name) != 0)
        i++;
    if (i == c->nodes.n)
        return ch_errf(err, errlen, CH_E_NOTFOUND, "no node \"%.64s\"", name);
    coord_node_t *n = c->nodes.v[i];
    if (n->link)
        return ch_errf(err, errlen, CH_E_STATE, "node %s is connected (%s); stop its workerd first",
                       n->name, coord_node_state_name(n->state));
    uint64_t active = ++c->stamp, done = ++c->stamp;
    mark_referenced(c, active, done);
    if (n->mark == active || n->used > 0)
        return ch_errf(err, errlen, CH_E_STATE,
                       "node %s holds ranks of an active job; cancel it or wait for it to end",
                       n->name);
    int rc = drop(c, i, n->mark == done, "chorusctl node forget");
    if (rc == 0 && (rc = coord_store_commit(c->store)) < 0) /* before the reply */
        return ch_errf(err, errlen, rc, "cannot store the change: %s", ch_strerror(rc));
    return rc < 0 ? ch_errf(err, errlen, rc, "out of memory") : 0;
}

/* Dead nodes past forget_dead_after_ms go, unless an active job still has ranks there. */
static void expire(coord_t *c, uint64_t now_ms)
{
    uint64_t after = (uint64_t)c->cfg.forget_dead_after_ms;
    size_t due = 0;
    if (after == 0 || now_ms < c->nodes.next_expiry_ms)
        return;
    c->nodes.next_expiry_ms = now_ms + 1000;
    for (size_t i = 0; i < c->nodes.n; i++) {
        const coord_node_t *n = c->nodes.v[i];
        due += n->state == COORD_NODE_DEAD && !n->link && now_ms - n->dead_since_ms >= after;
    }
    if (due == 0)
        return;
    uint64_t active = ++c->stamp, done = ++c->stamp;
    mark_referenced(c, active, done);
    for (size_t i = 0; i < c->nodes.n;) {
        coord_node_t *n = c->nodes.v[i];
        if (n->state == COORD_NODE_DEAD && !n->link && n->used == 0 && n->mark != active &&
            now_ms - n->dead_since_ms >= after && drop(c, i, n->mark == done, "dead too long") == 0)
            continue;
        i++;
    }
}

void coord_node_declare_dead(coord_t *c, coord_node_t *n, const char *why)
{
    set_state(c, n, COORD_NODE_DEAD, why);
    if (n->link) {
        /* A link that stays open while its node is dead is a hung workerd: cut it so
         * the worker reconnects and re-registers. */
        coord_link_t *l = n->link;
        l->node = NULL;
        n->link = NULL;
        coord_link_close(l);
    }
}

/* A walk of every node four times a second was the coordinator's largest cost between
 * messages at 16,384 ranks (a cache miss a node): walk again only once the node heard
 * longest ago can have passed dead-after. Hearing a node only moves its time later, so
 * nothing dies before; at most a second apart all the same (a registration's clock may
 * run a turn ahead of a heartbeat's, coord_turn_ms). */
#define NODE_CHECK_MAX_MS 1000

void coord_node_check(coord_t *c, uint64_t now_ms)
{
    expire(c, now_ms);
    /* Silence counts up to the last poll: a heartbeat that came in while the loop was
     * busy is not read yet (timers run before the poll). */
    uint64_t heard = c->polled_ms && c->polled_ms < now_ms ? c->polled_ms : now_ms;
    uint64_t dead_after = (uint64_t)c->cfg.dead_after_ms, next = heard + NODE_CHECK_MAX_MS;
    if (heard < c->nodes.next_check_ms) {
        coord_live_rearm(c, c->nodes.next_check_ms); /* due, but not polled since: 1 ms on */
        return;
    }
    for (size_t i = 0; i < c->nodes.n; i++) {
        coord_node_t *n = c->nodes.v[i];
        if (n->state == COORD_NODE_DEAD)
            continue;
        uint64_t quiet = heard > n->last_hb_ms ? heard - n->last_hb_ms : 0;
        if (quiet <= dead_after && n->last_hb_ms + dead_after + 1 < next)
            next = n->last_hb_ms + dead_after + 1;
        if (quiet > dead_after) {
            char why[64];
            snprintf(why, sizeof(why), "no heartbeat for %llu ms", (unsigned long long)quiet);
            coord_node_declare_dead(c, n, why);
        }
    }
    c->nodes.next_check_ms = next;
    coord_live_rearm(c, next);
}

int coord_node_send(coord_node_t *n, Chorus__Envelope *env)
{
    if (!n->link)
        return -EPIPE;
    /* Journal, then send: what this message relies on is on disk before it leaves. */
    coord_store_commit_journal(n->link->c->store);
    return coord_link_send(n->link, env);
}

static int load_one(void *ud, const coord_node_rec_t *rec)
{
    coord_t *c = ud;
    coord_node_t *n = coord_node_get(c, rec->name);
    if (!n)
        return -ENOMEM;
    snprintf(n->rack, sizeof(n->rack), "%s", rec->rack);
    if (ch_device_parse(rec->device, &n->device) < 0)
        n->device = CH_DEVICE_CPU; /* corrected when the node registers again */
    n->slots = rec->slots;
    n->state = COORD_NODE_DEAD; /* unknown until it registers again */
    n->dead_since_ms = ch_now_ms();
    return 0;
}

int coord_nodes_load(coord_t *c)
{
    int rc = coord_store_load_nodes(c->store, load_one, c);
    if (rc == 0 && c->nodes.n)
        CH_LOGI("node", "reloaded %zu nodes (dead until they register again)", c->nodes.n);
    return rc;
}

void coord_nodes_fini(coord_t *c)
{
    for (size_t i = 0; i < c->nodes.n; i++)
        free(c->nodes.v[i]);
    for (size_t i = 0; i < c->nodes.n_gone; i++)
        free(c->nodes.gone[i]);
    free(c->nodes.gone);
    free(c->nodes.v);
    free(c->nodes.ix);
    memset(&c->nodes, 0, sizeof(c->nodes));
}

void coord_nodes_count(const coord_t *c, size_t *counts)
{
    for (int s = 0; s < COORD_NODE_NSTATES; s++)
        counts[s] = 0;
    for (size_t i = 0; i < c->nodes.n; i++)
        counts[c->nodes.v[i]->state]++;
}

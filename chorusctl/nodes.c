/* chorusctl nodes: the coordinator's node registry as a table or a JSON array of
 * {name, state, slots, free_slots, rack, last_heartbeat_ms, memory_bytes} (0: not reported).
 * chorusctl node forget NAME: drop a node that is gone.
 * chorusctl drain NODE [--reason TEXT] / resume NODE: stop and restart new placements. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/msg.h"
#include "ctl.h"
#include "json.h"
#include "table.h"

static void print_json(const Chorus__NodeList *nl)
{
    ctl_json_t j;
    ctl_json_init(&j, stdout);
    ctl_json_arr_begin(&j);
    for (size_t i = 0; i < nl->n_nodes; i++) {
        const Chorus__NodeInfo *n = nl->nodes[i];
        ctl_json_obj_begin(&j);
        ctl_json_kstr(&j, "name", n->name);
        ctl_json_kstr(&j, "state", n->state);
        ctl_json_kuint(&j, "slots", n->slots);
        ctl_json_kuint(&j, "free_slots", n->free_slots);
        ctl_json_kstr(&j, "rack", n->rack);
        ctl_json_kuint(&j, "last_heartbeat_ms", n->last_heartbeat_ms);
        ctl_json_kuint(&j, "memory_bytes", n->memory_bytes);
        ctl_json_kstr(&j, "device", n->device && *n->device ? n->device : "cpu");
        ctl_json_key(&j, "drained");
        ctl_json_bool(&j, n->drained);
        ctl_json_kstr(&j, "drain_reason", n->drained ? n->drain_reason : NULL);
        ctl_json_obj_end(&j);
    }
    ctl_json_arr_end(&j);
    ctl_json_finish(&j);
}

static void print_table(const Chorus__NodeList *nl)
{
    ctl_table_t t;
    uint32_t slots = 0, free_slots = 0;
    size_t alive = 0;

    ctl_table_init(&t, 8);
    ctl_table_cell(&t, "NAME");
    ctl_table_cell(&t, "STATE");
    ctl_table_cell(&t, "SLOTS");
    ctl_table_cell(&t, "FREE");
    ctl_table_cell(&t, "RACK");
    ctl_table_cell(&t, "MEMORY");
    ctl_table_cell(&t, "DEVICE");
    ctl_table_cell(&t, "REASON");
    for (size_t i = 0; i < nl->n_nodes; i++) {
        const Chorus__NodeInfo *n = nl->nodes[i];
        ctl_table_cell(&t, "%s", n->name);
        ctl_table_cell(&t, "%s", n->state);
        ctl_table_cell(&t, "%" PRIu32, n->slots);
        ctl_table_cell(&t, "%" PRIu32, n->free_slots);
        ctl_table_cell(&t, "%s", n->rack && *n->rack ? n->rack : "-");
        if (n->memory_bytes)
            ctl_table_cell(&t, "%.1f GiB", (double)n->memory_bytes / 1073741824.0);
        else
            ctl_table_cell(&t, "-");
        ctl_table_cell(&t, "%s", n->device && *n->device ? n->device : "cpu");
        ctl_table_cell(&t, "%s", n->drained && n->drain_reason ? n->drain_reason : "");
        slots += n->slots;
        free_slots += n->free_slots;
        alive += n->state && strcmp(n->state, "alive") == 0;
    }
    ctl_table_print(&t, stdout);
    ctl_table_fini(&t);
    printf("%zu nodes (%zu alive), %" PRIu32 " slots, %" PRIu32 " free\n", nl->n_nodes, alive,
           slots, free_slots);
}

int ctl_cmd_nodes(ctl_t *ctl, int argc, char **argv)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;

    int st = ctl_args_words("nodes", &argc, &argv);
    if (st != CTL_EXIT_OK)
        return st;
    if (argc != 0) {
        ctl_usage("nodes");
        return CTL_EXIT_USAGE;
    }
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_NODES;
    req.list_nodes = &ln;
    st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_NODE_LIST, NULL, &resp);
    if (st != CTL_EXIT_OK)
        return st;
    if (ctl->json)
        print_json(resp->node_list);
    else
        print_table(resp->node_list);
    ch_msg_free(resp);
    return CTL_EXIT_OK;
}

/* Send req about node name, answered Ok; say so as {"name": name, key: val} or "name: text". */
static int node_act(ctl_t *ctl, Chorus__Envelope *req, const char *name, const char *key, int val,
                    const char *text)
{
    Chorus__Envelope *resp = NULL;
    int st = ctl_rpc(ctl, req, CHORUS__ENVELOPE__BODY_OK, name, &resp);
    if (st != CTL_EXIT_OK)
        return st;
    ch_msg_free(resp);
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_json_obj_begin(&j);
        ctl_json_kstr(&j, "name", name);
        ctl_json_key(&j, key);
        ctl_json_bool(&j, val);
        ctl_json_obj_end(&j);
        ctl_json_finish(&j);
    } else {
        printf("%s: %s\n", name, text);
    }
    return CTL_EXIT_OK;
}

int ctl_cmd_node(ctl_t *ctl, int argc, char **argv)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    Chorus__ForgetNode f = CHORUS__FORGET_NODE__INIT;

    int st = ctl_args_words("node", &argc, &argv);
    if (st != CTL_EXIT_OK)
        return st;
    if (argc != 2 || strcmp(argv[0], "forget") != 0) {
        ctl_usage("node");
        return CTL_EXIT_USAGE;
    }
    f.name = argv[1];
    req.body_case = CHORUS__ENVELOPE__BODY_FORGET_NODE;
    req.forget_node = &f;
    return node_act(ctl, &req, argv[1], "forgotten", 1, "forgotten");
}

enum { OPT_REASON = 256 };

const ctl_opt_t ctl_opts_drain[] = {
    {"reason", OPT_REASON, "TEXT", "why (shown in nodes)"},
    {NULL, 0, NULL, NULL},
};

/* drain NODE [--reason TEXT] (on = 1) or resume NODE (on = 0). */
static int drain(ctl_t *ctl, int argc, char **argv, int on)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    Chorus__DrainNode d = CHORUS__DRAIN_NODE__INIT;
    const char *cmd = on ? "drain" : "resume", *val;
    ctl_args_t a;
    int c;
    /* resume has no options: its table is empty */
    if (ctl_args_begin(&a, cmd, on ? ctl_opts_drain : NULL, argc, argv) < 0)
        return CTL_EXIT_USAGE;
    while ((c = ctl_args_next(&a, &val)) > 0)
        d.reason = (char *)val;
    if (c < 0)
        return CTL_EXIT_USAGE;
    if (a.npos != 1) {
        ctl_usage(cmd);
        return CTL_EXIT_USAGE;
    }
    const char *name = a.pos[0]; /* d's strings start as "", not NULL */
    d.name = (char *)name;
    d.drain = on;
    req.body_case = CHORUS__ENVELOPE__BODY_DRAIN_NODE;
    req.drain_node = &d;
    return node_act(ctl, &req, name, "drained", on, on ? "drained (no new ranks)" : "resumed");
}

int ctl_cmd_drain(ctl_t *ctl, int argc, char **argv)
{
    return drain(ctl, argc, argv, 1);
}

int ctl_cmd_resume(ctl_t *ctl, int argc, char **argv)
{
    return drain(ctl, argc, argv, 0);
}

/* chorusctl nodes: the coordinator's node registry as a table or a JSON array of
 * {name, state, slots, free_slots, rack, last_heartbeat_ms, memory_bytes} (0: not reported).
 * chorusctl node forget NAME: drop a node that is gone. */
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

    ctl_table_init(&t, 7);
    ctl_table_cell(&t, "NAME");
    ctl_table_cell(&t, "STATE");
    ctl_table_cell(&t, "SLOTS");
    ctl_table_cell(&t, "FREE");
    ctl_table_cell(&t, "RACK");
    ctl_table_cell(&t, "MEMORY");
    ctl_table_cell(&t, "DEVICE");
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

    if (argc != 0) {
        ctl_errf("usage: chorusctl nodes [--json]");
        return CTL_EXIT_USAGE;
    }
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_NODES;
    req.list_nodes = &ln;
    int st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_NODE_LIST, NULL, &resp);
    if (st != CTL_EXIT_OK)
        return st;
    if (ctl->json)
        print_json(resp->node_list);
    else
        print_table(resp->node_list);
    ch_msg_free(resp);
    return CTL_EXIT_OK;
}

int ctl_cmd_node(ctl_t *ctl, int argc, char **argv)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__ForgetNode f = CHORUS__FORGET_NODE__INIT;

    if (argc != 2 || strcmp(argv[0], "forget") != 0) {
        ctl_errf("usage: chorusctl node forget NAME");
        return CTL_EXIT_USAGE;
    }
    f.name = argv[1];
    req.body_case = CHORUS__ENVELOPE__BODY_FORGET_NODE;
    req.forget_node = &f;
    int st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_OK, argv[1], &resp);
    if (st != CTL_EXIT_OK)
        return st;
    ch_msg_free(resp);
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_json_obj_begin(&j);
        ctl_json_kstr(&j, "name", argv[1]);
        ctl_json_key(&j, "forgotten");
        ctl_json_bool(&j, 1);
        ctl_json_obj_end(&j);
        ctl_json_finish(&j);
    } else {
        printf("%s: forgotten\n", argv[1]);
    }
    return CTL_EXIT_OK;
}

/* chorusctl: submit, watch, cancel and inspect jobs, list nodes, run a local cluster
 * (DESIGN §10). main() separates the global options (--socket, --coordinator, --key,
 * --json, accepted anywhere on the line) from the command and its own words, then
 * dispatches through one table that also drives the usage text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "common/config.h"
#include "common/err.h"
#include "ctl.h"
#include "json.h"

typedef struct cmd {
    const char *name;
    int (*fn)(ctl_t *ctl, int argc, char **argv);
    const char *args;
    const char *help;
    const ctl_opt_t *opts; /* what it parses (args.c); NULL: positional words only */
} cmd_t;

static int cmd_help(ctl_t *ctl, int argc, char **argv);
static int cmd_completion(ctl_t *ctl, int argc, char **argv);

/* One row per command: it drives dispatch, `help`, the usage text and bash completion; its
 * options (opts) are what the command parses, `help COMMAND` lists and completion offers. */
static const cmd_t commands[] = {
    {"help", cmd_help, "[COMMAND]",
     "show every command, or one command's usage (also COMMAND --help)", NULL},
    {"keygen", ctl_cmd_keygen, "FILE", "write a new random cluster key (mode 0600)", NULL},
    {"nodes", ctl_cmd_nodes, "", "list nodes", NULL},
    {"node", ctl_cmd_node, "forget NAME",
     "forget a node that is gone (no link, no ranks of an active job); dead nodes are also "
     "forgotten after coordinatord's forget-dead-after-ms",
     NULL},
    {"drain", ctl_cmd_drain, "NODE [--reason TEXT]",
     "stop placing new ranks on a node (it keeps those it runs); root and admin-group only",
     ctl_opts_drain},
    {"resume", ctl_cmd_resume, "NODE", "let a drained node take ranks again", NULL},
    {"jobs", ctl_cmd_jobs, "[--state STATE[,STATE...]] [--user USER]",
     "list jobs: id, name, user, state, step, elapsed time, nodes, loss, layout; --state and "
     "--user keep the jobs in those states, of that user",
     ctl_opts_jobs},
    {"submit", ctl_cmd_submit, "JOBFILE [--set section.key=value]... [--wait]",
     "check and submit a job file; print its id", ctl_opts_submit},
    {"status", ctl_cmd_status,
     "JOB [--ranks | --rank N | --first N [--limit N]] [--metrics] [--history]",
     "show a job and its ranks (over 1,024 ranks: per state, detail on request)", ctl_opts_status},
    {"watch", ctl_cmd_watch, "JOB",
     "follow a job until it ends: a progress bar on a terminal, a line per change otherwise, a "
     "JSON object per line with --json; exits 0 when it completed, 1 when it failed or was "
     "cancelled",
     NULL},
    {"cancel", ctl_cmd_cancel, "JOB", "cancel a job", NULL},
    {"checkpoint", ctl_cmd_checkpoint, "JOB",
     "commit a checkpoint at the job's next step (what SIGUSR1 to coordinatord does for every "
     "running job)",
     NULL},
    {"kill-rank", ctl_cmd_kill_rank, "JOB RANK", "kill one rank process (fault drill)", NULL},
    {"logs", ctl_cmd_logs, "JOB [--rank R] [--generation G] [--follow] [--dir DIR]",
     "print the ranks' logs, served by the workerd of each rank (every generation, oldest "
     "first; --follow: the current one as it grows, until the job ends); --dir reads a local "
     "cluster's files instead",
     ctl_opts_logs},
    {"local", ctl_cmd_local,
     "up|down --dir DIR [--nodes N] [--slots S] [--heartbeat-ms N] [--dead-after-ms N] "
     "[--metrics HOST:PORT] [--device cpu|cuda]",
     "run a whole cluster on this machine (control socket DIR/ctl.sock; status page and "
     "metrics on 127.0.0.1, an ephemeral port, unless --metrics says otherwise)",
     ctl_opts_local},
    {"export", ctl_cmd_export, "CKPT_DIR --out DIR|FILE.safetensors [--dtype fp32|fp16|bf16]",
     "write a committed checkpoint (a step dir, or a job's dir: newest step) as a Hugging Face "
     "GPT-2: DIR/model.safetensors and DIR/config.json (from_pretrained(DIR) loads it), or one "
     ".safetensors file",
     ctl_opts_export},
    {"jobfile", ctl_cmd_jobfile, "--template [--markdown]",
     "print every job-file key with its default, unit, range and meaning: a job file to start "
     "from, or with --markdown the reference docs/jobfile.md",
     ctl_opts_jobfile},
    {"plan", ctl_cmd_plan, "JOBFILE [--set section.key=value]...",
     "check a job file and show its layout, parameters, memory per rank, FLOPs and pipeline "
     "bubble (no coordinator needed)",
     ctl_opts_plan},
    /* Usage only: "plan" above dispatches, and plan.c sees --auto. */
    {"plan --auto", ctl_cmd_plan,
     "JOBFILE [--set ...] [--nodes N --slots-per-node G] [CLUSTER OPTIONS] [--top K] [--verbose]",
     "propose the fastest layouts (tp pp dp, microbatches, micro_batch_size, reshard) for the "
     "job's model and global batch on the coordinator's alive nodes or on --nodes x "
     "--slots-per-node; CLUSTER OPTIONS (defaults: an A100 80 GB cluster): --mem-per-slot 80GiB "
     "--flops-per-slot 312T --mfu 0.5 --tp-busbw 300GB --dp-busbw 25GB --mem-reserve 0.05 "
     "--recompute none|selective|full; --verbose says why layouts were refused",
     ctl_opts_plan_auto},
    {"completion", cmd_completion, "bash",
     "print a bash completion script: source <(chorusctl completion bash)", NULL},
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: chorusctl [--socket PATH | --coordinator HOST:PORT --key FILE] COMMAND "
               "[--json]\n\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++) {
        char left[160];
        snprintf(left, sizeof left, "%s%s%s", commands[i].name, commands[i].args[0] ? " " : "",
                 commands[i].args);
        fprintf(f, "  %s\n      %s\n", left, commands[i].help);
    }
    fprintf(f,
            "\nenvironment: CHORUS_SOCKET, CHORUS_COORDINATOR, CHORUS_KEY (defaults for the "
            "options; default socket %s)\n"
            "exit status: 0 ok, 1 failed, 2 usage, 69 coordinator unreachable, 78 config "
            "error\n",
            CTL_DEFAULT_SOCKET);
}

/* Rows named name: "plan" matches "plan" and "plan --auto". */
static int row_is(const cmd_t *c, const char *name)
{
    size_t n = strlen(name);
    return strncmp(c->name, name, n) == 0 && (c->name[n] == '\0' || c->name[n] == ' ');
}

/* A command's options, one a line: "  -f, --follow      help". */
static void help_opts(const ctl_opt_t *opts)
{
    if (!opts || !opts[0].name)
        return;
    printf("options (--opt VALUE or --opt=VALUE; -- ends them):\n");
    for (const ctl_opt_t *o = opts; o->name; o++) {
        char left[96], letter[8] = "";
        if (o->key < 256)
            snprintf(letter, sizeof letter, "-%c, ", o->key);
        snprintf(left, sizeof left, "%s--%s%s%s", letter, o->name, o->arg ? " " : "",
                 o->arg ? o->arg : "");
        printf("  %-30s %s\n", left, o->help);
    }
}

void ctl_usage(const char *cmd)
{
    int opts = 0;
    for (size_t i = 0; i < NCOMMANDS; i++) {
        if (!row_is(&commands[i], cmd))
            continue;
        ctl_errf("usage: chorusctl %s%s%s", commands[i].name, commands[i].args[0] ? " " : "",
                 commands[i].args);
        opts |= commands[i].opts != NULL;
    }
    if (opts)
        ctl_errf("(chorusctl help %s: every option)", cmd);
}

/* `chorusctl help [COMMAND]`, `chorusctl COMMAND --help`. */
static int help(const char *name)
{
    int found = 0;
    if (!name) {
        usage(stdout);
        return CTL_EXIT_OK;
    }
    for (size_t i = 0; i < NCOMMANDS; i++) {
        if (!row_is(&commands[i], name))
            continue;
        printf("%susage: chorusctl %s%s%s\n    %s\n", found ? "\n" : "", commands[i].name,
               commands[i].args[0] ? " " : "", commands[i].args, commands[i].help);
        help_opts(commands[i].opts);
        found = 1;
    }
    if (!found) {
        ctl_errf("unknown command '%s' (try chorusctl help)", name);
        return CTL_EXIT_USAGE;
    }
    printf("\nglobal options: --socket PATH | --coordinator HOST:PORT --key FILE, --json\n");
    return CTL_EXIT_OK;
}

static int cmd_help(ctl_t *ctl, int argc, char **argv)
{
    (void)ctl;
    int st = ctl_args_words("help", &argc, &argv);
    if (st != CTL_EXIT_OK)
        return st;
    return help(argc > 0 ? argv[0] : NULL);
}

/* The --flags of every row named name (" --set --wait"), each once, appended to out. */
static void cmd_flags(const char *name, char *out, size_t n)
{
    for (size_t i = 0; i < NCOMMANDS; i++) {
        for (const ctl_opt_t *o = commands[i].opts; row_is(&commands[i], name) && o && o->name;
             o++) {
            char flag[80], padded[4200];
            snprintf(flag, sizeof flag, " --%s ", o->name);
            snprintf(padded, sizeof padded, " %s ", out);
            if (!strstr(padded, flag) && strlen(out) + strlen(flag) < n)
                snprintf(out + strlen(out), n - strlen(out), " --%s", o->name);
        }
    }
}

/* bash completion from the table: command names first, then each command's flags (and
 * files). A new row completes without touching this. */
static int cmd_completion(ctl_t *ctl, int argc, char **argv)
{
    (void)ctl;
    int st = ctl_args_words("completion", &argc, &argv);
    if (st != CTL_EXIT_OK)
        return st;
    if (argc != 1 || strcmp(argv[0], "bash") != 0) {
        ctl_usage("completion");
        return CTL_EXIT_USAGE;
    }
    printf("# chorusctl completion for bash: source <(chorusctl completion bash)\n"
           "_chorusctl() {\n"
           "  local cur=${COMP_WORDS[COMP_CWORD]} cmd='' i\n"
           "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
           "    case ${COMP_WORDS[i]} in\n"
           "    --socket | --coordinator | --key) ((i++)) ;;\n"
           "    -*) ;;\n"
           "    *) cmd=${COMP_WORDS[i]}; break ;;\n"
           "    esac\n"
           "  done\n"
           "  local words\n"
           "  case $cmd in\n"
           "  '' | help) words='");
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strchr(commands[i].name, ' '))
            printf("%s ", commands[i].name);
    printf("'\n    [[ -z $cmd ]] && words+=' --socket --coordinator --key --json --help "
           "--version' ;;\n");
    for (size_t i = 0; i < NCOMMANDS; i++) {
        char flags[4096] = "--json --help";
        if (strchr(commands[i].name, ' ') || commands[i].fn == cmd_help)
            continue;
        cmd_flags(commands[i].name, flags, sizeof flags);
        printf("  %s) words='%s' ;;\n", commands[i].name, flags);
    }
    printf("  esac\n"
           "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
           "  [[ -n $cmd && $cur != -* ]] && COMPREPLY+=($(compgen -f -- \"$cur\"))\n"
           "  return 0\n"
           "}\n"
           "complete -F _chorusctl chorusctl\n");
    return CTL_EXIT_OK;
}

/* "--name VALUE" or "--name=VALUE" at argv[*i]: 1 and *val (advancing *i past VALUE),
 * 0 when argv[*i] is another word, -EINVAL when VALUE is missing. */
static int opt_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0)
        return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != '\0')
        return 0;
    if (*i + 1 >= argc)
        return -EINVAL;
    *val = argv[++*i];
    return 1;
}

static const char *env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v && *v ? v : def;
}

int ctl_cmd_keygen(ctl_t *ctl, int argc, char **argv)
{
    int rc = ctl_args_words("keygen", &argc, &argv);
    if (rc != CTL_EXIT_OK)
        return rc;
    if (argc != 1) {
        ctl_usage("keygen");
        return CTL_EXIT_USAGE;
    }
    rc = ch_auth_global_init();
    if (rc == 0)
        rc = ch_key_generate(argv[0]);
    if (rc < 0) {
        ctl_errf("%s: %s", argv[0], ch_strerror(rc));
        return CTL_EXIT_FAILED;
    }
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_json_obj_begin(&j);
        ctl_json_kstr(&j, "key_file", argv[0]);
        ctl_json_obj_end(&j);
        ctl_json_finish(&j);
    } else
        printf("wrote a new cluster key to %s (mode 0600)\n", argv[0]);
    return CTL_EXIT_OK;
}

int main(int argc, char **argv)
{
    ctl_t ctl = {0};
    const char *sock_flag = NULL, *coord_flag = NULL, *val = NULL;
    char **words = calloc((size_t)argc + 1, sizeof *words);
    int nwords = 0, status = CTL_EXIT_USAGE, want_help = 0;

    if (!words) {
        ctl_errf("out of memory");
        return CTL_EXIT_FAILED;
    }
    ctl.key_path = env_or("CHORUS_KEY", NULL);
    for (int i = 1; i < argc; i++) {
        const struct {
            const char *name;
            const char **dst;
        } globals[] = {
            {"--socket", &sock_flag}, {"--coordinator", &coord_flag}, {"--key", &ctl.key_path}};
        int r = 0;
        if (strcmp(argv[i], "--") == 0) { /* the rest is the command's, "--" included */
            while (i < argc)
                words[nwords++] = argv[i++];
            break;
        }
        if (strcmp(argv[i], "--json") == 0) {
            ctl.json = 1;
            continue;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            want_help = 1; /* of the command, when one is named */
            continue;
        }
        if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            ch_config_version(stdout, "chorusctl");
            status = CTL_EXIT_OK;
            goto out;
        }
        for (size_t g = 0; g < sizeof globals / sizeof globals[0] && r == 0; g++) {
            r = opt_value(argc, argv, &i, globals[g].name, &val);
            if (r > 0)
                *globals[g].dst = val;
            else if (r < 0)
                ctl_errf("%s needs a value", globals[g].name);
        }
        if (r < 0)
            goto out;
        if (r == 0)
            words[nwords++] = argv[i];
    }
    /* Flags beat the environment; an explicit --socket beats CHORUS_COORDINATOR. */
    if (sock_flag && coord_flag) {
        ctl_errf("--socket and --coordinator are exclusive");
        goto out;
    }
    if (sock_flag) {
        ctl.socket_path = sock_flag;
    } else if (coord_flag) {
        ctl.coordinator = coord_flag;
    } else if (getenv("CHORUS_SOCKET") && *getenv("CHORUS_SOCKET")) {
        ctl.socket_path = getenv("CHORUS_SOCKET");
    } else {
        ctl.coordinator = env_or("CHORUS_COORDINATOR", NULL);
        ctl.socket_path = CTL_DEFAULT_SOCKET;
    }
    if (want_help) {
        status = help(nwords > 0 ? words[0] : NULL);
        goto out;
    }
    if (nwords == 0) {
        usage(stderr);
        goto out;
    }
    for (size_t c = 0; c < NCOMMANDS; c++) {
        if (strcmp(words[0], commands[c].name) == 0) {
            status = commands[c].fn(&ctl, nwords - 1, words + 1);
            goto out;
        }
    }
    ctl_errf("unknown command '%s' (try chorusctl --help)", words[0]);
out:
    free(words);
    return status;
}

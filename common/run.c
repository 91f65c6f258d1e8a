/* A training run's folder: run.json, the newest committed step, and the check of a job
 * against the filesystem as its user (run.h). */
#include "common/run.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/json.h"
#include "common/safetensors.h"
#include "common/util.h"

#define RUN_MAX_BYTES (64u << 10)

int ch_run_folder(const ch_jobspec_t *spec, char *out, size_t outlen)
{
    const char *name = spec->name;
    if (!name[0] || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return CH_E_CONFIG;
    int n = snprintf(out, outlen, "%s/%s", spec->checkpoint.dir, name);
    return n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
}

void ch_run_new_id(char *id)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) /* never fails for 8 bytes */
        v = ch_wall_ms() ^ ((uint64_t)getpid() << 32);
    snprintf(id, CH_RUN_ID_LEN, "r-%016" PRIx64, v);
}

// ----------------------------------------------------------------------------
// run.json

static int get_u32(const ch_json_t *o, const char *key, uint32_t *out)
{
    uint64_t v = 0;
    const ch_json_t *x = ch_json_get(o, key);
    if (!x || ch_json_u64(x, &v) < 0 || v > UINT32_MAX)
        return CH_E_FORMAT;
    *out = (uint32_t)v;
    return 0;
}

static int run_from_json(const ch_json_t *doc, ch_run_t *run)
{
    const char *fmt = ch_json_get_str(doc, "format"), *id = ch_json_get_str(doc, "run_id");
    const char *name = ch_json_get_str(doc, "name"), *from = ch_json_get_str(doc, "resumed_from");
    const ch_json_t *m = ch_json_get(doc, "model"), *t = ch_json_get(doc, "created_ms");
    if (!fmt || strcmp(fmt, CH_RUN_FORMAT) != 0 || !id || !id[0] || strlen(id) >= sizeof run->id ||
        !m)
        return CH_E_FORMAT;
    memset(run, 0, sizeof *run);
    snprintf(run->id, sizeof run->id, "%s", id);
    snprintf(run->name, sizeof run->name, "%s", name ? name : "");
    snprintf(run->resumed_from, sizeof run->resumed_from, "%s", from ? from : "");
    if (t)
        ch_json_u64(t, &run->created_ms);
    if (get_u32(m, "layers", &run->layers) < 0 || get_u32(m, "heads", &run->heads) < 0 ||
        get_u32(m, "embd", &run->embd) < 0 || get_u32(m, "vocab", &run->vocab) < 0 ||
        get_u32(m, "seq_len", &run->seq_len) < 0)
        return CH_E_FORMAT;
    return 0;
}

int ch_run_read(const char *folder, ch_run_t *run, char *err, size_t errlen)
{
    char path[CH_PATH_LEN + 16], why[256] = "";
    char *text = NULL;
    size_t len = 0;
    ch_json_t *doc = NULL;
    snprintf(path, sizeof path, "%s/" CH_RUN_FILE, folder);
    int rc = ch_file_read(path, RUN_MAX_BYTES, &text, &len);
    if (rc == -ENOENT)
        return rc;
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: %s", path, ch_strerror(rc));
    rc = ch_json_parse(text, len, NULL, &doc, why, sizeof why);
    if (rc == 0 && (rc = run_from_json(doc, run)) < 0)
        snprintf(why, sizeof why, "not a run file (format, run_id or model missing)");
    ch_json_free(doc);
    free(text);
    if (rc < 0)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: %s", path, why);
    return 0;
}

int ch_run_write(const char *folder, const ch_run_t *run, char *err, size_t errlen)
{
    char path[CH_PATH_LEN + 16];
    char *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/" CH_RUN_FILE, folder);
    ch_buf_t j;
    ch_buf_init(&j);
    ch_buf_puts(&j, "{\n  \"format\": \"" CH_RUN_FORMAT "\",\n  \"run_id\": ");
    ch_jw_str(&j, run->id);
    ch_buf_puts(&j, ",\n  \"name\": ");
    ch_jw_str(&j, run->name);
    ch_buf_printf(&j,
                  ",\n  \"created_ms\": %" PRIu64 ",\n  \"model\": {\"layers\": %" PRIu32
                  ", \"heads\": %" PRIu32 ", \"embd\": %" PRIu32 ", \"vocab\": %" PRIu32
                  ", \"seq_len\": %" PRIu32 "},\n  \"resumed_from\": ",
                  run->created_ms, run->layers, run->heads, run->embd, run->vocab, run->seq_len);
    ch_jw_str(&j, run->resumed_from);
    ch_buf_puts(&j, "\n}\n");
    int rc = ch_buf_finish(&j, &text, &len);
    if (rc == 0)
        rc = ch_file_write_atomic(path, text, len, 0644);
    free(text);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: %s", path, ch_strerror(rc));
    return 0;
}

int ch_run_latest(const char *folder, uint64_t *step)
{
    char pattern[CH_PATH_LEN + 64];
    glob_t g;
    int found = 0;
    snprintf(pattern, sizeof pattern,
             "%s/step-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]/manifest.json", folder);
    if (glob(pattern, 0, NULL, &g) != 0)
        return CH_E_NOTFOUND;
    /* glob sorts: eight digits make the last match the newest step */
    const char *last = g.gl_pathv[g.gl_pathc - 1];
    const char *s = strstr(last + strlen(folder), "/step-");
    if (s && sscanf(s, "/step-%8" SCNu64, step) == 1)
        found = 1;
    globfree(&g);
    return found ? 0 : CH_E_NOTFOUND;
}

// ----------------------------------------------------------------------------
// the check, as the calling process's user

/* "user alice (uid 1000)" into out. */
static void who(char *out, size_t n)
{
    uid_t uid = geteuid();
    struct passwd pw, *res = NULL;
    char buf[1024];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res)
        snprintf(out, n, "user %s (uid %u)", res->pw_name, (unsigned)uid);
    else
        snprintf(out, n, "uid %u", (unsigned)uid);
}

static int denied(const char *field, const char *what, const char *path, int e, char *err,
                  size_t errlen)
{
    char user[128];
    who(user, sizeof user);
    /* the code keeps the cause's class (ch_err_lasting): no restart brings a file back */
    int rc = e == EACCES || e == EPERM || e == EROFS ? -EACCES
             : e == ENOENT || e == ENOTDIR           ? -e
                                                     : CH_E_CONFIG;
    return ch_errf(err, errlen, rc, "%s: %s cannot %s %s: %s", field, user, what, path,
                   strerror(e));
}

/* A file the job reads. */
static int check_read(const char *field, const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO: no wait */
    if (fd < 0)
        return denied(field, "read", path, errno, err, errlen);
    close(fd);
    return 0;
}

/* train.data: a file, a glob of files ("text:" prefix allowed), or the built-in corpus. */
static int check_data(const char *data, char *err, size_t errlen)
{
    glob_t g;
    if (!data[0] || strcmp(data, "builtin") == 0)
        return 0;
    if (strncmp(data, "text:", 5) == 0)
        data += 5;
    if (!strpbrk(data, "*?["))
        return check_read("train.data", data, err, errlen);
    if (glob(data, 0, NULL, &g) != 0)
        return 0; /* nothing matched: the job file check names it */
    int rc = 0;
    for (size_t i = 0; i < g.gl_pathc && rc == 0; i++)
        rc = check_read("train.data", g.gl_pathv[i], err, errlen);
    globfree(&g);
    return rc;
}

/* The folder exists and takes a new file (ranks), or can be made (submit: its nearest
 * existing ancestor is writable). */
static int check_folder(const char *folder, int create, char *err, size_t errlen)
{
    char path[CH_PATH_LEN + 32];
    struct stat st;
    if (create) {
        int rc = ch_mkdirs(folder, 0755);
        if (rc < 0)
            return denied("checkpoint.dir", "create", folder, -rc, err, errlen);
        snprintf(path, sizeof path, "%s/.write-test-%d", folder, (int)getpid());
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
            return denied("checkpoint.dir", "write in", folder, errno, err, errlen);
        close(fd);
        unlink(path);
        return 0;
    }
    snprintf(path, sizeof path, "%s", folder);
    while (stat(path, &st) != 0) { /* the nearest existing ancestor */
        char *slash = strrchr(path, '/');
        if (errno != ENOENT || !slash)
            return denied("checkpoint.dir", "reach", path, errno, err, errlen);
        if (slash == path)
            slash[1] = '\0';
        else
            *slash = '\0';
    }
    if (!S_ISDIR(st.st_mode))
        return ch_errf(err, errlen, CH_E_CONFIG, "checkpoint.dir: %s is not a directory", path);
    if (access(path, W_OK | X_OK) != 0)
        return denied("checkpoint.dir",
                      strcmp(path, folder) == 0 ? "write in" : "create folders in", path, errno,
                      err, errlen);
    return 0;
}

/* The model of step_dir's rank 0 shard against the job's [model]. */
static int check_model(const ch_jobspec_t *s, const char *step_dir, char *err, size_t errlen)
{
    char path[CH_PATH_LEN + 40], why[512] = "";
    ch_st_file_t *f = NULL;
    snprintf(path, sizeof path, "%s/rank-00000.safetensors", step_dir);
    int rc = ch_st_open(path, &f, why, sizeof why);
    if (rc < 0)
        return ch_errf(err, errlen, CH_E_CONFIG, "train.resume: %s", why);
    const char *keys[5] = {"model.layers", "model.heads", "model.embd", "model.vocab",
                           "model.seq_len"};
    const uint32_t want[5] = {s->model.layers, s->model.heads, s->model.embd, s->model.vocab,
                              s->model.seq_len};
    for (int i = 0; i < 5 && rc == 0; i++) {
        const char *v = ch_st_meta(f, keys[i]);
        if (!v || strtoull(v, NULL, 10) != want[i])
            rc = ch_errf(err, errlen, CH_E_CONFIG,
                         "train.resume: %s holds another model: %s %s, the job's is %" PRIu32,
                         step_dir, keys[i], v ? v : "missing", want[i]);
    }
    ch_st_close(f);
    return rc;
}

/* train.resume = PATH: a committed step dir, or a run folder (its newest committed step).
 * out->step_dir, out->step, and the run folder into run_folder. */
static int resolve_path(const char *path, ch_run_resume_t *out, char *run_folder, size_t n,
                        char *err, size_t errlen)
{
    char m[CH_PATH_LEN + 32];
    struct stat st;
    snprintf(m, sizeof m, "%s/manifest.json", path);
    if (stat(path, &st) != 0)
        return denied("train.resume", "read", path, errno, err, errlen);
    if (stat(m, &st) == 0) { /* a step dir */
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        if (sscanf(base, "step-%8" SCNu64, &out->step) != 1)
            return ch_errf(err, errlen, CH_E_CONFIG, "train.resume: %s: not a step-NNNNNNNN folder",
                           path);
        snprintf(out->step_dir, sizeof out->step_dir, "%s", path);
        snprintf(run_folder, n, "%.*s", (int)(base - path > 0 ? base - path - 1 : 1),
                 base - path > 0 ? path : ".");
        return 0;
    }
    if (ch_run_latest(path, &out->step) < 0)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "train.resume: %s holds no committed checkpoint (a step-NNNNNNNN folder "
                       "with manifest.json, or a run folder holding one)",
                       path);
    snprintf(run_folder, n, "%s", path);
    int w = snprintf(out->step_dir, sizeof out->step_dir, "%s/step-%08" PRIu64, path, out->step);
    return w < 0 || (size_t)w >= sizeof out->step_dir ? -ENAMETOOLONG : 0;
}

/* Same folder, whatever the spelling (realpath; both exist). */
static int same_folder(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* The resume source and the run the job belongs to. folder: DIR/NAME ("" without
 * checkpoint.dir); own: its run.json (own->id "" when none). */
static int check_resume(const ch_jobspec_t *s, const char *folder, const ch_run_t *own, int ours,
                        ch_run_resume_t *out, char *err, size_t errlen)
{
    const char *resume = s->train.resume;
    char from[CH_PATH_LEN];
    if (strcmp(resume, "auto") == 0) {
        snprintf(out->run_id, sizeof out->run_id, "%s", own->id);
        if (!folder[0] || ch_run_latest(folder, &out->step) < 0)
            return 0; /* nothing yet: a fresh start of this run */
        snprintf(out->step_dir, sizeof out->step_dir, "%s/step-%08" PRIu64, folder, out->step);
        return check_model(s, out->step_dir, err, errlen);
    }
    if (!resume[0]) {
        if (own->id[0] && !ours)
            return ch_errf(err, errlen, CH_E_CONFIG,
                           "checkpoint.dir: %s holds run %s; set train.resume = auto to continue "
                           "it, or choose another job.name or checkpoint.dir",
                           folder, own->id);
        return 0;
    }
    int rc = resolve_path(resume, out, from, sizeof from, err, errlen);
    if (rc == 0)
        rc = check_model(s, out->step_dir, err, errlen);
    if (rc < 0)
        return rc;
    int inside = folder[0] && same_folder(from, folder);
    if (own->id[0] && !inside && !ours)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "checkpoint.dir: %s holds run %s, and train.resume %s is not in it; "
                       "choose another job.name or checkpoint.dir for the continued run",
                       folder, own->id, resume);
    if (inside)
        snprintf(out->run_id, sizeof out->run_id, "%s", own->id);
    return 0;
}

int ch_run_check(const ch_jobspec_t *s, int ranks, ch_run_resume_t *out, char *err, size_t errlen)
{
    char folder[CH_PATH_LEN] = "";
    ch_run_t own;
    ch_run_resume_t res;
    memset(&own, 0, sizeof own);
    memset(&res, 0, sizeof res);
    int rc = check_data(s->train.data, err, errlen);
    if (rc == 0 && s->train.init_from[0])
        rc = check_read("train.init_from", s->train.init_from, err, errlen);
    if (rc < 0 || s->kind != CH_JOB_TRAIN)
        goto out;
    if (s->checkpoint.dir[0]) {
        if (ch_run_folder(s, folder, sizeof folder) < 0)
            return ch_errf(err, errlen, CH_E_CONFIG, "checkpoint.dir: path too long");
        if ((rc = check_folder(folder, ranks, err, errlen)) < 0)
            goto out;
        rc = ch_run_read(folder, &own, err, errlen);
        if (rc == -ENOENT)
            rc = 0;
        if (rc < 0)
            goto out;
        if (own.id[0] && s->checkpoint.run_id[0] && strcmp(own.id, s->checkpoint.run_id) != 0) {
            rc = ch_errf(err, errlen, CH_E_CONFIG,
                         "checkpoint.dir: %s holds run %s, not this job's run %s", folder, own.id,
                         s->checkpoint.run_id);
            goto out;
        }
    } else if (strcmp(s->train.resume, "auto") == 0) {
        rc = ch_errf(err, errlen, CH_E_CONFIG, "train.resume: auto needs checkpoint.dir");
        goto out;
    }
    /* a rank: the submit-time rules held, and run.json is this job's run (checked above
     * when the job is stamped with one): its rank 0 wrote it in an earlier generation */
    int ours = ranks && own.id[0];
    rc = check_resume(s, folder, &own, ours, &res, err, errlen);
out:
    if (rc == 0 && out)
        *out = res;
    return rc;
}

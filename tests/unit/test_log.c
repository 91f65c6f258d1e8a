/* Log lines as journald and a terminal read them: under systemd (stderr is the stream
 * JOURNAL_STREAM names) each line starts with its syslog priority and carries no timestamp
 * of its own; anywhere else it starts with an ISO-8601 UTC timestamp. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "support.h"

static char dir[512], path[600];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("test_log", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/stderr", dir);
}

static void teardown(void)
{
    cr_expect_eq(ts_rmrf(dir), 0);
}

TestSuite(log, .init = setup, .fini = teardown, .timeout = 30);

/* stderr goes to a fresh file; journal: JOURNAL_STREAM names that file (else another). */
static void log_to_file(int journal)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(dup2(fd, 2), 2);
    close(fd);
    struct stat st;
    cr_assert_eq(fstat(2, &st), 0);
    char js[64];
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + (journal ? 0 : 1));
    setenv("JOURNAL_STREAM", js, 1);
    ch_log_init("workerd");
    ch_log_set_level(CH_LOG_DEBUG);
    CH_LOGE("net", "link lost");
    CH_LOGW("net", "slow peer");
    CH_LOGI("main", "started");
    CH_LOGD("main", "detail");
}

static char *read_back(void)
{
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(ch_file_read(path, 1 << 16, &text, &len), 0);
    return text;
}

Test(log, under_journald_lines_carry_their_priority_and_no_timestamp)
{
    log_to_file(1);
    char *t = read_back();
    cr_expect_str_eq(t, "<3>workerd ERROR net: link lost\n"
                        "<4>workerd WARN net: slow peer\n"
                        "<6>workerd INFO main: started\n"
                        "<7>workerd DEBUG main: detail\n");
    free(t);
}

Test(log, elsewhere_lines_start_with_a_utc_timestamp)
{
    log_to_file(0); /* JOURNAL_STREAM inherited, but stderr is another file: a rank's log */
    char *t = read_back();
    int y, mo, d, h, mi, s, ms;
    char rest[64];
    cr_assert_eq(
        sscanf(t, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ %63[^\n]", &y, &mo, &d, &h, &mi, &s, &ms, rest), 8,
        "%s", t);
    cr_expect_str_eq(rest, "workerd ERROR net: link lost");
    cr_expect(strchr(t, '<') == NULL, "%s", t);
    free(t);
}

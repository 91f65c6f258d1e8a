/* Job owners and the identity ranks run as; see users.h. */
#include "users.h"

#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <unistd.h>

#include "common/err.h"

int coord_users_init(coord_users_t *u, const char *run_as_user, const char *admin_group,
                     int allow_root)
{
    char buf[4096];
    *u = (coord_users_t){.self = getuid(), .allow_root = allow_root};
    if (run_as_user && run_as_user[0]) {
        struct passwd pw, *res = NULL;
        int found = getpwnam_r(run_as_user, &pw, buf, sizeof buf, &res) == 0 && res;
        /* With allow-root-jobs root's jobs run as root and the user is never used. */
        if (!found && !allow_root)
            return CH_E_CONFIG;
        if (found) {
            u->service_uid = res->pw_uid;
            u->service_gid = res->pw_gid;
            u->have_service = 1;
        }
    }
    if (admin_group && admin_group[0]) {
        struct group gr, *res = NULL;
        if (getgrnam_r(admin_group, &gr, buf, sizeof buf, &res) != 0 || !res)
            return CH_E_CONFIG;
        u->admin_gid = res->gr_gid;
        u->have_admin = 1;
    }
    return 0;
}

int coord_users_in_group(uid_t uid, gid_t gid, gid_t g)
{
    if (gid == g)
        return 1;
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) != 0 || !res)
        return 0;
    gid_t groups[256];
    int ng = 256;
    if (getgrouplist(res->pw_name, res->pw_gid, groups, &ng) < 0)
        ng = 256; /* more groups than we look at: check the first 256 */
    for (int i = 0; i < ng; i++)
        if (groups[i] == g)
            return 1;
    return 0;
}

coord_cred_t coord_users_cred(const coord_users_t *u, int is_unix, uid_t uid, gid_t gid)
{
    coord_cred_t c = {.known = 1, .uid = uid, .gid = gid};
    if (!is_unix) {
        c.uid = u->self; /* a cluster-key holder acts as the daemon */
        c.gid = getgid();
        c.admin = 1;
        return c;
    }
    c.admin = uid == 0 || uid == u->self ||
              (u->have_admin && coord_users_in_group(uid, gid, u->admin_gid));
    return c;
}

int coord_users_stamp(const coord_users_t *u, const coord_cred_t *who, ch_jobspec_t *spec,
                      char *err, size_t errlen)
{
    spec->owner.uid = who->uid;
    spec->owner.gid = who->gid;
    spec->run_as.uid = who->uid;
    spec->run_as.gid = who->gid;
    if (who->uid != 0 || u->allow_root)
        return 0;
    if (!u->have_service)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "jobs of root need run-as-user (or allow-root-jobs) in coordinatord's "
                       "configuration");
    spec->run_as.uid = u->service_uid;
    spec->run_as.gid = u->service_gid;
    return 0;
}

int coord_users_may_see(const coord_cred_t *who, const ch_jobspec_t *spec)
{
    return who->admin || (spec->owner.uid >= 0 && (uid_t)spec->owner.uid == who->uid);
}

int coord_users_may_act(const coord_cred_t *who, const ch_jobspec_t *spec, const char *job_id,
                        char *err, size_t errlen)
{
    if (coord_users_may_see(who, spec))
        return 0;
    return ch_errf(err, errlen, -EACCES,
                   "permission denied: job %s belongs to uid %lld, not to uid %lu", job_id,
                   (long long)spec->owner.uid, (unsigned long)who->uid);
}

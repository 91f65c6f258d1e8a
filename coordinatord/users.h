/* Users (DESIGN §10): a job belongs to whoever submitted it and its ranks run as that
 * user. Control-socket peers are known by SO_PEERCRED; a TCP client holding the cluster
 * key is trusted as the daemon itself (it could act as a worker anyway). Root's jobs
 * run as the configured service user (run-as-user) unless allow-root-jobs is set.
 * Root, the daemon's own user and members of admin-group may act on every job; others
 * on their own jobs only. */
#ifndef COORD_USERS_H
#define COORD_USERS_H

#include <sys/types.h>

#include "common/jobspec.h"

/* Who is on the other end of a control link. */
typedef struct coord_cred {
    int known; /* 0 until the link is ready */
    uid_t uid;
    gid_t gid;
    int admin; /* may act on every job */
} coord_cred_t;

typedef struct coord_users {
    uid_t self;        /* the daemon's own uid */
    uid_t service_uid; /* run-as-user: root's jobs run as this user */
    gid_t service_gid;
    int have_service;
    int allow_root; /* allow-root-jobs: root's jobs run as root */
    gid_t admin_gid;
    int have_admin;
} coord_users_t;

/* Resolve run-as-user ("" : none; root's jobs are then refused unless allowed) and
 * admin-group ("" : none). CH_E_CONFIG naming the option when a name is unknown. */
int coord_users_init(coord_users_t *u, const char *run_as_user, const char *admin_group,
                     int allow_root);
/* 1 when uid (primary group gid) is in group g, supplementary groups included. */
int coord_users_in_group(uid_t uid, gid_t gid, gid_t g);
/* Credentials of a control link: a Unix peer (is_unix, uid, gid) or a TCP key holder. */
coord_cred_t coord_users_cred(const coord_users_t *u, int is_unix, uid_t uid, gid_t gid);
/* Stamp a submitted spec with its owner and run-as identity, overriding what the client
 * sent. CH_E_CONFIG (err set) when root submits, root is not allowed and no service user
 * is configured. */
int coord_users_stamp(const coord_users_t *u, const coord_cred_t *who, ch_jobspec_t *spec,
                      char *err, size_t errlen);
/* 0 when who may cancel or kill ranks of a job owned by spec->owner; -EACCES with err. */
/* 1 when who may read the job's text, its reasons and its history (its owner, root,
 * the daemon's user, admin-group); others see only its row. */
int coord_users_may_see(const coord_cred_t *who, const ch_jobspec_t *spec);
int coord_users_may_act(const coord_cred_t *who, const ch_jobspec_t *spec, const char *job_id,
                        char *err, size_t errlen);

#endif

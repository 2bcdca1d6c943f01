// One-line wrappers that call through the kv_nixl function table: cgo
// cannot call C function pointers directly.

#ifndef KVROUTE_NIXL_CALLS_H
#define KVROUTE_NIXL_CALLS_H

#include "capi.h"

static inline kv_status cgoCreateNotifMap(const kv_nixl *l, kv_notif_map *m) { return l->create_notif_map(m); }
static inline kv_status cgoDestroyNotifMap(const kv_nixl *l, kv_notif_map m) { return l->destroy_notif_map(m); }
static inline kv_status cgoDestroyAgent(const kv_nixl *l, kv_agent a) { return l->destroy_agent(a); }
static inline kv_status cgoDestroyBackend(const kv_nixl *l, kv_backend b) { return l->destroy_backend(b); }
static inline kv_status cgoGetLocalMD(const kv_nixl *l, kv_agent a, void **d, size_t *n) { return l->get_local_md(a, d, n); }
static inline kv_status cgoLoadRemoteMD(const kv_nixl *l, kv_agent a, const void *d, size_t n, char **name) { return l->load_remote_md(a, d, n, name); }
static inline kv_status cgoInvalidateRemoteMD(const kv_nixl *l, kv_agent a, const char *r) { return l->invalidate_remote_md(a, r); }
static inline kv_status cgoReleaseDlist(const kv_nixl *l, kv_agent a, kv_dlist_handle h) { return l->release_xfer_dlist_handle(a, h); }
static inline kv_status cgoMakeReq(const kv_nixl *l, kv_agent a, kv_op op, kv_dlist_handle lh, const int *li, size_t n, kv_dlist_handle rh, const int *ri, size_t m, kv_xfer_req *out, kv_opt_args o) {
	return l->make_xfer_req(a, op, lh, li, n, rh, ri, m, out, o);
}
static inline kv_status cgoDestroyOpt(const kv_nixl *l, kv_opt_args o) { return l->destroy_opt_args(o); }
static inline kv_status cgoGenNotif(const kv_nixl *l, kv_agent a, const char *r, const void *m, size_t n) { return l->gen_notif(a, r, m, n, NULL); }
static inline kv_status cgoPost(const kv_nixl *l, kv_agent a, kv_xfer_req r, kv_opt_args o) { return l->post_xfer_req(a, r, o); }
static inline kv_status cgoStatus(const kv_nixl *l, kv_agent a, kv_xfer_req r) { return l->get_xfer_status(a, r); }

#endif

// Declarations of the parts of NIXL's C API (libnixl_capi.so, the
// nixl_capi_* functions) that kvroute uses, written from NIXL's documented
// C API (v1.4/v1.5) so that building needs neither NIXL's headers nor its
// libraries: the library is opened with dlopen at run time and each
// function is looked up with dlsym into a kv_nixl table.

#ifndef KVROUTE_NIXL_CAPI_H
#define KVROUTE_NIXL_CAPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// nixl_capi_status_t values.
enum {
	KV_CAPI_SUCCESS = 0,
	KV_CAPI_ERROR_INVALID_PARAM = -1,
	KV_CAPI_ERROR_BACKEND = -2,
	KV_CAPI_ERROR_INVALID_STATE = -3,
	KV_CAPI_ERROR_EXCEPTION = -4,
	KV_CAPI_IN_PROG = 1,
	KV_CAPI_ERROR_NO_TELEMETRY = -5,
	KV_CAPI_ERROR_NOT_FOUND = -6,
	// Not NIXL's: a function the loaded library lacks.
	KV_CAPI_MISSING = -100,
};

// nixl_capi_thread_sync_t values.
enum { KV_SYNC_NONE = 0, KV_SYNC_STRICT = 1, KV_SYNC_RW = 2 };

typedef int kv_status; // nixl_capi_status_t (an int-sized C enum)
typedef int kv_mem;    // nixl_capi_mem_type_t
typedef int kv_op;     // nixl_capi_xfer_op_t

// Opaque handles.
typedef struct kv_agent_s *kv_agent;
typedef struct kv_params_s *kv_params;
typedef struct kv_mem_list_s *kv_mem_list;
typedef struct kv_string_list_s *kv_string_list;
typedef struct kv_backend_s *kv_backend;
typedef struct kv_opt_args_s *kv_opt_args;
typedef struct kv_param_iter_s *kv_param_iter;
typedef struct kv_xfer_dlist_s *kv_xfer_dlist;
typedef struct kv_dlist_handle_s *kv_dlist_handle;
typedef struct kv_reg_dlist_s *kv_reg_dlist;
typedef struct kv_xfer_req_s *kv_xfer_req;
typedef struct kv_notif_map_s *kv_notif_map;

// nixl_capi_agent_config_t.
typedef struct {
	bool enable_prog_thread;
	bool enable_listen_thread;
	int listen_port;
	int thread_sync;
	unsigned int num_workers;
	uint64_t pthr_delay_us;
	uint64_t lthr_delay_us;
	bool capture_telemetry;
} kv_agent_config;

// The function table, filled by kv_open. Field names are the C API's
// function names without the nixl_capi_ prefix.
typedef struct {
	kv_status (*create_configured_agent)(const char *, const kv_agent_config *, kv_agent *);
	kv_status (*destroy_agent)(kv_agent);
	kv_status (*get_local_md)(kv_agent, void **, size_t *);
	kv_status (*load_remote_md)(kv_agent, const void *, size_t, char **);
	kv_status (*invalidate_remote_md)(kv_agent, const char *);
	kv_status (*get_available_plugins)(kv_agent, kv_string_list *);
	kv_status (*string_list_size)(kv_string_list, size_t *);
	kv_status (*string_list_get)(kv_string_list, size_t, const char **);
	kv_status (*destroy_string_list)(kv_string_list);
	kv_status (*get_plugin_params)(kv_agent, const char *, kv_mem_list *, kv_params *);
	kv_status (*get_backend_params)(kv_agent, kv_backend, kv_mem_list *, kv_params *);
	kv_status (*mem_list_size)(kv_mem_list, size_t *);
	kv_status (*mem_list_get)(kv_mem_list, size_t, kv_mem *);
	kv_status (*destroy_mem_list)(kv_mem_list);
	kv_status (*create_params)(kv_params *);
	kv_status (*params_add)(kv_params, const char *, const char *);
	kv_status (*params_is_empty)(kv_params, bool *);
	kv_status (*params_create_iterator)(kv_params, kv_param_iter *);
	kv_status (*params_iterator_next)(kv_param_iter, const char **, const char **, bool *);
	kv_status (*params_destroy_iterator)(kv_param_iter);
	kv_status (*destroy_params)(kv_params);
	kv_status (*create_backend)(kv_agent, const char *, kv_params, kv_backend *);
	kv_status (*destroy_backend)(kv_backend);
	kv_status (*create_opt_args)(kv_opt_args *);
	kv_status (*destroy_opt_args)(kv_opt_args);
	kv_status (*opt_args_add_backend)(kv_opt_args, kv_backend);
	kv_status (*opt_args_set_notif_msg)(kv_opt_args, const void *, size_t);
	kv_status (*opt_args_set_has_notif)(kv_opt_args, bool);
	kv_status (*opt_args_set_skip_desc_merge)(kv_opt_args, bool);
	kv_status (*create_reg_dlist)(kv_mem, kv_reg_dlist *);
	kv_status (*reg_dlist_add_desc)(kv_reg_dlist, uintptr_t, size_t, uint64_t, const void *, size_t);
	kv_status (*destroy_reg_dlist)(kv_reg_dlist);
	kv_status (*register_mem)(kv_agent, kv_reg_dlist, kv_opt_args);
	kv_status (*deregister_mem)(kv_agent, kv_reg_dlist, kv_opt_args);
	kv_status (*create_xfer_dlist)(kv_mem, kv_xfer_dlist *);
	kv_status (*xfer_dlist_add_desc)(kv_xfer_dlist, uintptr_t, size_t, uint64_t);
	kv_status (*destroy_xfer_dlist)(kv_xfer_dlist);
	kv_status (*prep_xfer_dlist)(kv_agent, const char *, kv_xfer_dlist, kv_dlist_handle *, kv_opt_args);
	kv_status (*release_xfer_dlist_handle)(kv_agent, kv_dlist_handle);
	kv_status (*make_xfer_req)(kv_agent, kv_op, kv_dlist_handle, const int *, size_t, kv_dlist_handle, const int *, size_t, kv_xfer_req *, kv_opt_args);
	kv_status (*create_xfer_req)(kv_agent, kv_op, kv_xfer_dlist, kv_xfer_dlist, const char *, kv_xfer_req *, kv_opt_args);
	kv_status (*post_xfer_req)(kv_agent, kv_xfer_req, kv_opt_args);
	kv_status (*get_xfer_status)(kv_agent, kv_xfer_req);
	kv_status (*release_xfer_req)(kv_agent, kv_xfer_req);
	kv_status (*destroy_xfer_req)(kv_xfer_req);
	kv_status (*create_notif_map)(kv_notif_map *);
	kv_status (*destroy_notif_map)(kv_notif_map);
	kv_status (*get_notifs)(kv_agent, kv_notif_map, kv_opt_args);
	kv_status (*notif_map_size)(kv_notif_map, size_t *);
	kv_status (*notif_map_get_agent_at)(kv_notif_map, size_t, const char **);
	kv_status (*notif_map_get_notifs_size)(kv_notif_map, const char *, size_t *);
	kv_status (*notif_map_get_notif)(kv_notif_map, const char *, size_t, const void **, size_t *);
	kv_status (*notif_map_clear)(kv_notif_map);
	kv_status (*gen_notif)(kv_agent, const char *, const void *, size_t, kv_opt_args);
} kv_nixl;

// kv_open loads the library at path and looks up every function. On
// failure it returns NULL and writes the loader's message to err.
kv_nixl *kv_open(const char *path, char *err, size_t errlen);

// A growable byte buffer the helpers return results in; the caller frees
// data with free().
typedef struct {
	char *data;
	size_t len, cap;
} kv_buf;

kv_status kv_create_agent(const kv_nixl *l, const char *name, bool prog_thread, int sync, uint64_t pthr_delay_us, kv_agent *out);
kv_status kv_plugins(const kv_nixl *l, kv_agent a, kv_buf *out);
kv_status kv_create_backend(const kv_nixl *l, kv_agent a, const char *plugin, const char *kvs, size_t nkv, kv_backend *out);
kv_status kv_backend_params(const kv_nixl *l, kv_agent a, kv_backend b, kv_buf *out, uint32_t *mems);
kv_status kv_register(const kv_nixl *l, kv_agent a, bool reg, kv_mem mem, const uint64_t *descs, size_t n, const char *meta, const uint64_t *meta_lens);
kv_status kv_opts(const kv_nixl *l, const void *notif, size_t notif_len, bool has_notif, bool skip_merge, kv_backend *backends, size_t nb, kv_opt_args *out);
kv_status kv_prep(const kv_nixl *l, kv_agent a, const char *remote, kv_mem mem, const uint64_t *descs, size_t n, kv_dlist_handle *out);
kv_status kv_create_req(const kv_nixl *l, kv_agent a, kv_op op, kv_mem lmem, const uint64_t *ldescs, kv_mem rmem, const uint64_t *rdescs, size_t n, const char *remote, kv_opt_args opt, kv_xfer_req *out);
kv_status kv_release_req(const kv_nixl *l, kv_agent a, kv_xfer_req r);
kv_status kv_take_notifs(const kv_nixl *l, kv_agent a, kv_notif_map m, kv_buf *out);

#endif

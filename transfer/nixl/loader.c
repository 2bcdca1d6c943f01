//go:build cgo

#include "capi.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_FN(name) {"nixl_capi_" #name, offsetof(kv_nixl, name)}

static const struct {
	const char *sym;
	size_t off;
} kv_fns[] = {
	KV_FN(create_configured_agent), KV_FN(destroy_agent), KV_FN(get_local_md),
	KV_FN(load_remote_md), KV_FN(invalidate_remote_md), KV_FN(get_available_plugins),
	KV_FN(string_list_size), KV_FN(string_list_get), KV_FN(destroy_string_list),
	KV_FN(get_plugin_params), KV_FN(get_backend_params), KV_FN(mem_list_size),
	KV_FN(mem_list_get), KV_FN(destroy_mem_list), KV_FN(create_params),
	KV_FN(params_add), KV_FN(params_is_empty), KV_FN(params_create_iterator),
	KV_FN(params_iterator_next), KV_FN(params_destroy_iterator), KV_FN(destroy_params),
	KV_FN(create_backend), KV_FN(destroy_backend), KV_FN(create_opt_args),
	KV_FN(destroy_opt_args), KV_FN(opt_args_add_backend), KV_FN(opt_args_set_notif_msg),
	KV_FN(opt_args_set_has_notif), KV_FN(opt_args_set_skip_desc_merge), KV_FN(create_reg_dlist),
	KV_FN(reg_dlist_add_desc), KV_FN(destroy_reg_dlist), KV_FN(register_mem),
	KV_FN(deregister_mem), KV_FN(create_xfer_dlist), KV_FN(xfer_dlist_add_desc),
	KV_FN(destroy_xfer_dlist), KV_FN(prep_xfer_dlist), KV_FN(release_xfer_dlist_handle),
	KV_FN(make_xfer_req), KV_FN(create_xfer_req), KV_FN(post_xfer_req),
	KV_FN(get_xfer_status), KV_FN(release_xfer_req), KV_FN(destroy_xfer_req),
	KV_FN(create_notif_map), KV_FN(destroy_notif_map), KV_FN(get_notifs),
	KV_FN(notif_map_size), KV_FN(notif_map_get_agent_at), KV_FN(notif_map_get_notifs_size),
	KV_FN(notif_map_get_notif), KV_FN(notif_map_clear), KV_FN(gen_notif),
};

kv_nixl *kv_open(const char *path, char *err, size_t errlen) {
	// RTLD_LOCAL keeps NIXL's symbols out of the global namespace; the
	// library is never closed, because its plugins start threads that may
	// outlive any one agent.
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *msg = dlerror();
		snprintf(err, errlen, "%s", msg ? msg : "dlopen failed");
		return NULL;
	}
	kv_nixl *l = calloc(1, sizeof *l);
	if (!l) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < sizeof kv_fns / sizeof kv_fns[0]; i++) {
		void *f = dlsym(h, kv_fns[i].sym);
		if (!f) {
			snprintf(err, errlen, "%s: missing symbol %s", path, kv_fns[i].sym);
			free(l);
			return NULL;
		}
		memcpy((char *)l + kv_fns[i].off, &f, sizeof f);
	}
	return l;
}

static int kv_grow(kv_buf *b, size_t n) {
	if (b->len + n <= b->cap) {
		return 1;
	}
	size_t cap = b->cap ? b->cap : 256;
	while (cap < b->len + n) {
		cap *= 2;
	}
	char *d = realloc(b->data, cap);
	if (!d) {
		return 0;
	}
	b->data = d;
	b->cap = cap;
	return 1;
}

// kv_put appends a u32 length and the bytes.
static int kv_put(kv_buf *b, const void *p, size_t n) {
	uint32_t n32 = (uint32_t)n;
	if (!kv_grow(b, 4 + n)) {
		return 0;
	}
	memcpy(b->data + b->len, &n32, 4);
	if (n) {
		memcpy(b->data + b->len + 4, p, n);
	}
	b->len += 4 + n;
	return 1;
}

kv_status kv_create_agent(const kv_nixl *l, const char *name, bool prog_thread, int sync, uint64_t pthr_delay_us, kv_agent *out) {
	kv_agent_config cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.enable_prog_thread = prog_thread;
	cfg.listen_port = 8888; // NIXL's default_comm_port; unused without a listener
	cfg.thread_sync = sync;
	cfg.num_workers = 1;
	cfg.pthr_delay_us = pthr_delay_us;
	cfg.lthr_delay_us = 100000;
	return l->create_configured_agent(name, &cfg, out);
}

kv_status kv_plugins(const kv_nixl *l, kv_agent a, kv_buf *out) {
	kv_string_list sl;
	kv_status st = l->get_available_plugins(a, &sl);
	if (st != KV_CAPI_SUCCESS) {
		return st;
	}
	size_t n = 0;
	st = l->string_list_size(sl, &n);
	for (size_t i = 0; st == KV_CAPI_SUCCESS && i < n; i++) {
		const char *s;
		st = l->string_list_get(sl, i, &s);
		if (st == KV_CAPI_SUCCESS && !kv_put(out, s, strlen(s))) {
			st = KV_CAPI_ERROR_BACKEND;
		}
	}
	l->destroy_string_list(sl);
	return st;
}

// kv_dump_params appends every key and value of p to out.
static kv_status kv_dump_params(const kv_nixl *l, kv_params p, kv_buf *out) {
	bool empty = true;
	kv_status st = l->params_is_empty(p, &empty);
	if (st != KV_CAPI_SUCCESS || empty) {
		return st;
	}
	kv_param_iter it;
	st = l->params_create_iterator(p, &it);
	if (st != KV_CAPI_SUCCESS) {
		return st;
	}
	bool more = true;
	while (st == KV_CAPI_SUCCESS && more) {
		const char *k, *v;
		st = l->params_iterator_next(it, &k, &v, &more);
		if (st == KV_CAPI_SUCCESS && k && v && (!kv_put(out, k, strlen(k)) || !kv_put(out, v, strlen(v)))) {
			st = KV_CAPI_ERROR_BACKEND;
		}
	}
	l->params_destroy_iterator(it);
	return st;
}

// kv_mem_mask returns the memory kinds of a list as a bit mask.
static kv_status kv_mem_mask(const kv_nixl *l, kv_mem_list m, uint32_t *mask) {
	size_t n = 0;
	kv_status st = l->mem_list_size(m, &n);
	*mask = 0;
	for (size_t i = 0; st == KV_CAPI_SUCCESS && i < n; i++) {
		kv_mem t;
		st = l->mem_list_get(m, i, &t);
		if (st == KV_CAPI_SUCCESS && t >= 0 && t < 32) {
			*mask |= 1u << t;
		}
	}
	return st;
}

kv_status kv_create_backend(const kv_nixl *l, kv_agent a, const char *plugin, const char *kvs, size_t nkv, kv_backend *out) {
	kv_params p;
	kv_mem_list m = NULL;
	kv_status st;
	if (nkv == 0) {
		// No parameters given: start from the plugin's defaults.
		st = l->get_plugin_params(a, plugin, &m, &p);
	} else {
		st = l->create_params(&p);
		for (size_t i = 0; st == KV_CAPI_SUCCESS && i < nkv; i++) {
			const char *k = kvs;
			const char *v = k + strlen(k) + 1;
			kvs = v + strlen(v) + 1;
			st = l->params_add(p, k, v);
		}
	}
	if (st != KV_CAPI_SUCCESS) {
		return st;
	}
	st = l->create_backend(a, plugin, p, out);
	l->destroy_params(p);
	if (m) {
		l->destroy_mem_list(m);
	}
	return st;
}

kv_status kv_backend_params(const kv_nixl *l, kv_agent a, kv_backend b, kv_buf *out, uint32_t *mems) {
	kv_mem_list m;
	kv_params p;
	kv_status st = l->get_backend_params(a, b, &m, &p);
	if (st != KV_CAPI_SUCCESS) {
		return st;
	}
	st = kv_mem_mask(l, m, mems);
	if (st == KV_CAPI_SUCCESS) {
		st = kv_dump_params(l, p, out);
	}
	l->destroy_mem_list(m);
	l->destroy_params(p);
	return st;
}

kv_status kv_register(const kv_nixl *l, kv_agent a, bool reg, kv_mem mem, const uint64_t *descs, size_t n, const char *meta, const uint64_t *meta_lens) {
	kv_reg_dlist dl;
	kv_status st = l->create_reg_dlist(mem, &dl);
	if (st != KV_CAPI_SUCCESS) {
		return st;
	}
	for (size_t i = 0; st == KV_CAPI_SUCCESS && i < n; i++) {
		const uint64_t *d = descs + 3 * i;
		st = l->reg_dlist_add_desc(dl, (uintptr_t)d[0], (size_t)d[1], d[2], meta_lens[i] ? meta : NULL, (size_t)meta_lens[i]);
		meta += meta_lens[i];
	}
	if (st == KV_CAPI_SUCCESS) {
		st = reg ? l->register_mem(a, dl, NULL) : l->deregister_mem(a, dl, NULL);
	}
	l->destroy_reg_dlist(dl);
	return st;
}

kv_status kv_opts(const kv_nixl *l, const void *notif, size_t notif_len, bool has_notif, bool skip_merge, kv_backend *backends, size_t nb, kv_opt_args *out) {
	kv_opt_args o;
	kv_status st = l->create_opt_args(&o);
	if (st != KV_CAPI_SUCCESS) {
		return st;
	}
	if (has_notif) {
		st = l->opt_args_set_notif_msg(o, notif_len ? notif : "", notif_len);
		if (st == KV_CAPI_SUCCESS) {
			st = l->opt_args_set_has_notif(o, true);
		}
	}
	if (st == KV_CAPI_SUCCESS && skip_merge) {
		st = l->opt_args_set_skip_desc_merge(o, true);
	}
	for (size_t i = 0; st == KV_CAPI_SUCCESS && i < nb; i++) {
		st = l->opt_args_add_backend(o, backends[i]);
	}
	if (st != KV_CAPI_SUCCESS) {
		l->destroy_opt_args(o);
		return st;
	}
	*out = o;
	return st;
}

// kv_dlist builds a transfer descriptor list from (addr, len, dev) triples.
static kv_status kv_dlist(const kv_nixl *l, kv_mem mem, const uint64_t *descs, size_t n, kv_xfer_dlist *out) {
	kv_status st = l->create_xfer_dlist(mem, out);
	for (size_t i = 0; st == KV_CAPI_SUCCESS && i < n; i++) {
		const uint64_t *d = descs + 3 * i;
		st = l->xfer_dlist_add_desc(*out, (uintptr_t)d[0], (size_t)d[1], d[2]);
	}
	if (st != KV_CAPI_SUCCESS && *out) {
		l->destroy_xfer_dlist(*out);
	}
	return st;
}

kv_status kv_prep(const kv_nixl *l, kv_agent a, const char *remote, kv_mem mem, const uint64_t *descs, size_t n, kv_dlist_handle *out) {
	kv_xfer_dlist dl = NULL;
	kv_status st = kv_dlist(l, mem, descs, n, &dl);
	if (st != KV_CAPI_SUCCESS) {
		return st;
	}
	st = l->prep_xfer_dlist(a, remote, dl, out, NULL);
	l->destroy_xfer_dlist(dl);
	return st;
}

kv_status kv_create_req(const kv_nixl *l, kv_agent a, kv_op op, kv_mem lmem, const uint64_t *ldescs, kv_mem rmem, const uint64_t *rdescs, size_t n, const char *remote, kv_opt_args opt, kv_xfer_req *out) {
	kv_xfer_dlist ld = NULL, rd = NULL;
	kv_status st = kv_dlist(l, lmem, ldescs, n, &ld);
	if (st != KV_CAPI_SUCCESS) {
		return st;
	}
	st = kv_dlist(l, rmem, rdescs, n, &rd);
	if (st == KV_CAPI_SUCCESS) {
		st = l->create_xfer_req(a, op, ld, rd, remote, out, opt);
		l->destroy_xfer_dlist(rd);
	}
	l->destroy_xfer_dlist(ld);
	return st;
}

kv_status kv_release_req(const kv_nixl *l, kv_agent a, kv_xfer_req r) {
	kv_status st = l->release_xfer_req(a, r);
	if (st == KV_CAPI_SUCCESS) {
		st = l->destroy_xfer_req(r);
	}
	return st;
}

kv_status kv_take_notifs(const kv_nixl *l, kv_agent a, kv_notif_map m, kv_buf *out) {
	kv_status st = l->get_notifs(a, m, NULL);
	if (st != KV_CAPI_SUCCESS) {
		return st;
	}
	size_t agents = 0;
	st = l->notif_map_size(m, &agents);
	for (size_t i = 0; st == KV_CAPI_SUCCESS && i < agents; i++) {
		const char *name;
		size_t n = 0;
		st = l->notif_map_get_agent_at(m, i, &name);
		if (st == KV_CAPI_SUCCESS) {
			st = l->notif_map_get_notifs_size(m, name, &n);
		}
		for (size_t j = 0; st == KV_CAPI_SUCCESS && j < n; j++) {
			const void *msg;
			size_t len;
			st = l->notif_map_get_notif(m, name, j, &msg, &len);
			if (st == KV_CAPI_SUCCESS && (!kv_put(out, name, strlen(name)) || !kv_put(out, msg, len))) {
				st = KV_CAPI_ERROR_BACKEND;
			}
		}
	}
	l->notif_map_clear(m);
	return st;
}

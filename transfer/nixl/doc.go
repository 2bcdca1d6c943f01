// Package nixl is the transfer backend that drives NVIDIA NIXL through its
// C API, loaded at run time.
//
// New opens libnixl_capi.so with dlopen and looks up each nixl_capi_*
// function with dlsym, with prototypes declared in this package's own C
// header (capi.h), the way NVIDIA's nixl-sys crate (feature stub-api) and
// go-nvml load their libraries. Building kvroute therefore needs a C
// compiler but neither NIXL's headers nor its libraries; with
// CGO_ENABLED=0 the package still compiles and New returns an error
// wrapping transfer.ErrUnavailable. Descriptor lists cross into C in one
// call per list, however long.
//
// # Usage
//
//  1. Install NIXL: an NVIDIA container (/opt/nvidia/nvda_nixl), a source
//     install (set NIXL_PREFIX), or the PyPI wheel nixl-cu12 (set
//     NIXL_LIB_DIR to the wheel's .nixl_cu12.mesonpy.libs directory). NIXL
//     loads plugins from NIXL_PLUGIN_DIR, or from the plugins directory
//     beside libnixl.so.
//  2. Create an agent per rank with New (UCX backend by default; add
//     "POSIX" for files, "GDS" for GPUDirect Storage), register the KV
//     cache (device pointers are plain uintptrs), and exchange metadata.
//  3. Use it as any transfer.Agent; run the transfertest suite against
//     your build to check the installation.
//
// For example:
//
//	a, err := nixl.New(nixl.Config{Name: "decode-0", Backends: []string{"UCX"}})
//	if errors.Is(err, transfer.ErrUnavailable) {
//		// fall back to the tcp backend, or report err: it lists every path tried
//	}
//
// # Errors
//
// NIXL's C API reports most failures as one "backend error" code. The
// agent checks locally what it can (its own registrations, known remote
// agents, index ranges, descriptor lengths), so those failures carry the
// precise sentinel; what NIXL refuses beyond that is classified by the call
// that failed (a refused remote list is ErrNotRegistered, a failed post of
// a loaded peer ErrRemoteDisconnect, a post or request to a peer whose
// metadata was invalidated ErrUnknownAgent, memory of a kind no backend
// moves ErrNotSupported) and keeps NIXL's raw code in transfer.Error.Code.
//
// NIXL's requests and prepared lists point into the registrations they
// were made with. DeregisterMem refuses memory a posted request still
// moves (ErrInProgress); once local memory is deregistered, Post and
// MakeRequest refuse the requests and lists made from it with
// ErrNotRegistered, even after the memory is registered again: make them
// again from the new registration.
//
// The library stays loaded for the life of the process once loaded: its
// plugins start threads that must not lose their code.
package nixl

package main

/*
#include "mooncake.h"
*/
import "C"

//export mcgoDebugPanic
func mcgoDebugPanic(cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainABI)
	defer c.catch(&st)
	panic("mc_debug_panic: a panic on purpose")
}

//export mcgoDebugLiveHandles
func mcgoDebugLiveHandles(engines, stores *C.uint64_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainABI)
	defer c.catch(&st)
	var ne, ns C.uint64_t
	live.Range(func(_, v any) bool {
		switch v.(type) {
		case *engineObj:
			ne++
		case *storeObj:
			ns++
		}
		return true
	})
	if engines != nil {
		*engines = ne
	}
	if stores != nil {
		*stores = ns
	}
	return C.MC_OK
}

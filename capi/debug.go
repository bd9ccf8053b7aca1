package main

/*
#include "mooncake.h"
*/
import "C"

//export mcgoDebugPanic
func mcgoDebugPanic(cerr *C.mc_error_t) C.mc_status_t {
	return guard(cerr, domainABI, func() error {
		panic("mc_debug_panic: a panic on purpose")
	})
}

//export mcgoDebugLiveHandles
func mcgoDebugLiveHandles(engines, stores *C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return guard(cerr, domainABI, func() error {
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
		return nil
	})
}

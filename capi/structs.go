package main

/*
#include "mooncake.h"
*/
import "C"

import (
	"slices"
	"unsafe"
)

// Structs that grow. A struct the caller passes in with a struct_size
// (mc_engine_config_t, mc_store_config_t, mc_replicate_config_t) may come
// from a program built against an older header, whose struct ends before
// the fields appended since, or from a newer one, whose struct has fields
// this library does not know. The rules are mooncake.h's VERSIONING:
//
//   - a size below the struct's first version (MC_*_SIZE_V1) is refused:
//     struct_size was not set; so is one between two published versions
//     (MC_*_SIZE_Vn), which would cut a field in two;
//   - the bytes the caller's size covers are read, no more (reading further
//     could run off the caller's memory); the fields past them keep zero,
//     which every field documents as its default;
//   - bytes past this library's struct are accepted only when they are all
//     zero (a newer caller that leaves its new fields at their defaults
//     asks for nothing this library could miss); a nonzero one is refused
//     rather than ignored, since the caller asked for something this
//     library would silently not do.

// maxStructSize bounds struct_size, so that a garbage size is refused
// rather than read up to.
const maxStructSize = 1 << 16

// readStruct copies the caller's struct at p, of size bytes as its
// struct_size says, into a T of this library's layout; versions are the
// sizes of the struct's published versions, the first first, and name
// names it in errors.
func readStruct[T any](p *T, size C.uint32_t, name string, versions ...uintptr) (T, error) {
	var t T
	known := unsafe.Sizeof(t)
	n := uintptr(size)
	if n < versions[0] || n > maxStructSize {
		return t, abiErrorf(C.MC_ERR_STRUCT_SIZE, "%s.struct_size %d: want %d (version 1) to %d; set it with the _init helper",
			name, size, versions[0], maxStructSize)
	}
	if n < known && !slices.Contains(versions, n) {
		return t, abiErrorf(C.MC_ERR_STRUCT_SIZE, "%s.struct_size %d is no published version's size (%v); set it with the _init helper",
			name, size, versions)
	}
	src := unsafe.Slice((*byte)(unsafe.Pointer(p)), n)
	if n > known {
		for i, b := range src[known:] {
			if b != 0 {
				return t, abiErrorf(C.MC_ERR_STRUCT_SIZE,
					"%s.struct_size %d: byte %d is set, in a field this library (ABI %d.%d, %d bytes) does not know",
					name, size, known+uintptr(i), C.MC_ABI_VERSION_MAJOR, C.MC_ABI_VERSION_MINOR, known)
			}
		}
		src = src[:known]
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&t)), known), src)
	return t, nil
}

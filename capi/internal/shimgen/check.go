package main

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// loadedPid is the C function of the Go library (capi/loaded_pid.c) that the
// loader resolves besides the exports.
const loadedPid = "mcgo_loaded_pid"

// check verifies a build: the public library defines exactly the functions
// the public headers declare (declared: name -> header), refers to no
// mcgo* it does not define, and the Go library defines every export the
// forwarders resolve.
func check(lib, golib string, exports []export, declared map[string]string) error {
	defined, undefined, err := dynamicSymbols(lib)
	if err != nil {
		return err
	}
	var problems []string
	for name, h := range declared {
		if !defined[name] {
			problems = append(problems, fmt.Sprintf("%s declares %s, which %s does not define (no function in capi/shim.c, no forwarder of a Go export of that name)", h, name, lib))
		}
	}
	for name := range defined {
		if _, ok := declared[name]; !ok {
			problems = append(problems, fmt.Sprintf("%s exports %s, which no public header declares (capi/exports.map lets it through)", lib, name))
		}
	}
	for name := range undefined {
		if strings.HasPrefix(name, "mcgo") {
			problems = append(problems, fmt.Sprintf("%s calls %s but does not define it (no forwarder)", lib, name))
		}
	}
	goDefined, _, err := dynamicSymbols(golib)
	if err != nil {
		return err
	}
	for _, e := range append(exports, export{Name: loadedPid}) {
		if !goDefined[e.Name] {
			problems = append(problems, fmt.Sprintf("%s does not export %s, which the forwarders resolve (see its version script, capi/exports_go.map)", golib, e.Name))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// ntGNUBuildID is the note type of a GNU build ID (elf.h's NT_GNU_BUILD_ID).
const ntGNUBuildID = 3

// buildID returns the GNU build ID of the ELF file at path.
func buildID(path string) ([]byte, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if id := noteBuildID(data, f.ByteOrder, p.Align); id != nil {
			return id, nil
		}
	}
	return nil, fmt.Errorf("%s has no GNU build ID note (link with --build-id)", path)
}

// noteBuildID finds the NT_GNU_BUILD_ID note in the notes of a PT_NOTE
// segment (entries aligned to align bytes).
func noteBuildID(data []byte, order binary.ByteOrder, align uint64) []byte {
	a := 4
	if align == 8 {
		a = 8
	}
	up := func(n int) int { return (n + a - 1) &^ (a - 1) }
	for len(data) >= 12 {
		namesz, descsz, typ := int(order.Uint32(data)), int(order.Uint32(data[4:])), order.Uint32(data[8:])
		nameEnd := 12 + up(namesz)
		if namesz < 0 || descsz < 0 || nameEnd+descsz > len(data) {
			return nil
		}
		if typ == ntGNUBuildID && string(data[12:12+namesz]) == "GNU\x00" {
			return data[nameEnd : nameEnd+descsz]
		}
		data = data[min(len(data), nameEnd+up(descsz)):]
	}
	return nil
}

// dynamicSymbols returns the names in the dynamic symbol table of the
// shared library at path: those it defines and those it needs.
func dynamicSymbols(path string) (defined, undefined map[string]bool, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	defined, undefined = map[string]bool{}, map[string]bool{}
	for _, s := range syms {
		if s.Name == "" || elf.ST_BIND(s.Info) == elf.STB_LOCAL {
			continue
		}
		if s.Section == elf.SHN_UNDEF {
			undefined[s.Name] = true
		} else {
			defined[s.Name] = true
		}
	}
	return defined, undefined, nil
}

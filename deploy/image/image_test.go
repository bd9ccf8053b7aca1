package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// build assembles an archive around bin into dir and returns its path.
func build(t *testing.T, dir, bin string) string {
	t.Helper()
	out := filepath.Join(dir, "image.oci.tar")
	if err := run(Options{Binary: bin, Arch: "amd64", Tag: "latest", User: "65534:65534"}, out, false); err != nil {
		t.Fatal(err)
	}
	return out
}

// The archive built around a binary (this test's own executable, an ELF
// file) checks: digests, sizes, diff_id, and /mooncake is that binary,
// byte for byte. Built twice, it is the same bytes (reproducible).
func TestArchiveConsistent(t *testing.T) {
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := build(t, dir, bin)
	r, err := Verify(out)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(want)
	if r.BinarySize != int64(len(want)) || r.BinarySHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("/mooncake in the layer: %d bytes %s, want %d bytes %x", r.BinarySize, r.BinarySHA256, len(want), sum)
	}
	for _, f := range []string{"etc/passwd", "etc/group", "etc/nsswitch.conf", "mooncake"} {
		if !strings.Contains(strings.Join(r.LayerFiles, "\n")+"\n", f+"\n") {
			t.Errorf("layer lacks %s: %q", f, r.LayerFiles)
		}
	}
	if r.Config.Config.User != "65534:65534" || r.Config.Created != time.Unix(0, 0).UTC().Format(time.RFC3339) {
		t.Errorf("config: user %q created %q", r.Config.Config.User, r.Config.Created)
	}
	first, _ := os.ReadFile(out)
	second, _ := os.ReadFile(build(t, t.TempDir(), bin))
	if !bytes.Equal(first, second) {
		t.Error("two builds of the same binary differ")
	}
}

// The negative controls: Verify rejects an archive whose blob content was
// changed (its name no longer its digest), one whose manifest names a
// wrong layer size, and one whose layer lacks /mooncake.
func TestVerifyRejects(t *testing.T) {
	bin, _ := os.Executable()
	good := build(t, t.TempDir(), bin)
	r, err := Verify(good)
	if err != nil {
		t.Fatal(err)
	}
	layerName := "blobs/sha256/" + strings.TrimPrefix(r.Layer.Digest, "sha256:")

	cases := map[string]func(name string, b []byte) []byte{
		"flipped layer byte": func(name string, b []byte) []byte {
			if name == layerName {
				b = bytes.Clone(b)
				b[len(b)/2] ^= 1
			}
			return b
		},
		"index names another manifest size": func(name string, b []byte) []byte {
			if name == "index.json" {
				return bytes.Replace(b, []byte(`"size":`), []byte(`"size":1`), 1)
			}
			return b
		},
	}
	for what, edit := range cases {
		t.Run(what, func(t *testing.T) {
			bad := rewrite(t, good, edit)
			if _, err := Verify(bad); err == nil {
				t.Fatal("Verify accepted a corrupted archive")
			} else {
				t.Log(err)
			}
		})
	}
	t.Run("no binary", func(t *testing.T) {
		if err := r.readLayer(tarOf(t, "etc/passwd", []byte("root:x:0:0::/:/x\n"))); err == nil {
			t.Fatal("a layer without /mooncake passed")
		}
	})
}

// cmd/mooncake builds with CGO_ENABLED=0 (engine/device has a cgo-free
// build), as one static executable that runs, and the image around it
// checks. Before engine/device/nocgo.go this build failed: "build
// constraints exclude all Go files in engine/device".
func TestStaticBinaryImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/mooncake")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "mooncake")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/mooncake")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build ./cmd/mooncake: %v\n%s", err, out)
	}
	if err := static(bin); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "node", "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "--global_segment_size") {
		t.Fatalf("the static binary: node --help: %v\n%s", err, out)
	}
	r, err := Verify(build(t, dir, bin))
	if err != nil {
		t.Fatal(err)
	}
	if r.BinarySize == 0 {
		t.Fatal("no binary in the layer")
	}
}

// static fails for a dynamically linked executable (an interpreter or a
// dynamic section).
func static(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			return fmt.Errorf("%s is dynamically linked (%v): build it with CGO_ENABLED=0", bin, p.Type)
		}
	}
	return nil
}

// The binary `make image` builds is static (no interpreter, no dynamic
// section): the image has no libc. Checked when build/image/mooncake exists
// (make image), as is the archive it wrote.
func TestMakeImageOutput(t *testing.T) {
	bin := filepath.Join("..", "..", "build", "image", "mooncake")
	archive := filepath.Join("..", "..", "build", "mooncake-image.oci.tar")
	if _, err := os.Stat(archive); err != nil {
		t.Skip("no build/mooncake-image.oci.tar: run make image")
	}
	if err := static(bin); err != nil {
		t.Fatal(err)
	}
	r, err := Verify(archive)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(bin)
	if sum := sha256.Sum256(want); r.BinarySHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("the archive's /mooncake is not %s", bin)
	}
}

// rewrite copies the archive at path, passing each file through edit.
func rewrite(t *testing.T, path string, edit func(string, []byte) []byte) string {
	t.Helper()
	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out := filepath.Join(t.TempDir(), "bad.tar")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tr := tar.NewReader(in)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		b = edit(h.Name, b)
		h.Size = int64(len(b))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	tw.Close()
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func tarOf(t *testing.T, name string, body []byte) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write(body)
	tw.Close()
	return buf.Bytes()
}

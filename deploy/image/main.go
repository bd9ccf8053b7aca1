// Command image assembles the container image of mooncake's static binary
// as an OCI image-layout archive, offline and from scratch: no base image
// is pulled, the one layer holds /mooncake and the few /etc files a static
// Go binary reads (passwd and group for os/user, nsswitch.conf so that the
// resolver consults /etc/hosts first). `make image` builds the binary with
// CGO_ENABLED=0 and runs this; load the result with e.g.
//
//	skopeo copy oci-archive:build/mooncake-image.oci.tar docker-daemon:mooncake:latest
//	podman load -i build/mooncake-image.oci.tar
//
// The archive is reproducible: every timestamp is SOURCE_DATE_EPOCH (0 when
// unset), so the same binary gives the same digests.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"
)

// OCI media types (image-spec v1.1).
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
	refNameKey    = "org.opencontainers.image.ref.name"
)

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type imageConfig struct {
	Created      string `json:"created"`
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User       string   `json:"User"`
		Env        []string `json:"Env"`
		Entrypoint []string `json:"Entrypoint"`
		WorkingDir string   `json:"WorkingDir"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
	History []struct {
		Created   string `json:"created"`
		CreatedBy string `json:"created_by"`
	} `json:"history"`
}

// Options say what goes into the image.
type Options struct {
	Binary string    // the static mooncake binary, copied to /mooncake
	Arch   string    // GOARCH naming of the image's architecture
	Tag    string    // index.json's ref name
	User   string    // the image's default user (uid:gid)
	Time   time.Time // every timestamp
}

// The /etc files: root and nobody (the default user), and name lookups
// from /etc/hosts before DNS, as Kubernetes pods expect.
var etcFiles = []struct{ name, body string }{
	{"etc/passwd", "root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"},
	{"etc/group", "root:x:0:\nnobody:x:65534:\n"},
	{"etc/nsswitch.conf", "hosts: files dns\n"},
}

// layer is the image's one filesystem layer, uncompressed.
func layer(o Options) ([]byte, error) {
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("image: reading the binary: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(name string, typ byte, mode int64, size int) *tar.Header {
		return &tar.Header{Name: name, Typeflag: typ, Mode: mode, Size: int64(size),
			ModTime: o.Time, Format: tar.FormatPAX}
	}
	for _, d := range []struct {
		name string
		mode int64
	}{{"etc/", 0o755}, {"tmp/", 0o1777}} {
		if err := tw.WriteHeader(hdr(d.name, tar.TypeDir, d.mode, 0)); err != nil {
			return nil, err
		}
	}
	for _, f := range etcFiles {
		if err := tw.WriteHeader(hdr(f.name, tar.TypeReg, 0o644, len(f.body))); err != nil {
			return nil, err
		}
		if _, err := io.WriteString(tw, f.body); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(hdr("mooncake", tar.TypeReg, 0o755, len(bin))); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Build writes the OCI image-layout archive to w.
func Build(w io.Writer, o Options) error {
	raw, err := layer(o)
	if err != nil {
		return err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return err
	}
	if _, err := zw.Write(raw); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}

	var cfg imageConfig
	created := o.Time.UTC().Format(time.RFC3339)
	cfg.Created, cfg.Architecture, cfg.OS = created, o.Arch, "linux"
	cfg.Config.User = o.User
	cfg.Config.Env = []string{"PATH=/"}
	cfg.Config.Entrypoint = []string{"/mooncake"}
	cfg.Config.WorkingDir = "/tmp"
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{digest(raw)}
	cfg.History = append(cfg.History, struct {
		Created   string `json:"created"`
		CreatedBy string `json:"created_by"`
	}{created, "deploy/image: /mooncake (CGO_ENABLED=0) and /etc/{passwd,group,nsswitch.conf}"})
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}

	m := manifest{SchemaVersion: 2, MediaType: mediaManifest,
		Config: descriptor{MediaType: mediaConfig, Digest: digest(cfgJSON), Size: int64(len(cfgJSON))},
		Layers: []descriptor{{MediaType: mediaLayerGz, Digest: digest(gz.Bytes()), Size: int64(gz.Len())}}}
	mJSON, err := json.Marshal(m)
	if err != nil {
		return err
	}
	idx := index{SchemaVersion: 2, MediaType: mediaIndex, Manifests: []descriptor{{
		MediaType: mediaManifest, Digest: digest(mJSON), Size: int64(len(mJSON)),
		Annotations: map[string]string{refNameKey: o.Tag}}}}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: o.Time, Format: tar.FormatPAX})
	}
	file := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644,
			Size: int64(len(b)), ModTime: o.Time, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	blob := func(b []byte) error { return file("blobs/sha256/"+digest(b)[len("sha256:"):], b) }
	for _, step := range []func() error{
		func() error { return file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)) },
		func() error { return file("index.json", idxJSON) },
		func() error { return dir("blobs/") },
		func() error { return dir("blobs/sha256/") },
		func() error { return blob(cfgJSON) },
		func() error { return blob(mJSON) },
		func() error { return blob(gz.Bytes()) },
	} {
		if err := step(); err != nil {
			return fmt.Errorf("image: writing the archive: %w", err)
		}
	}
	return tw.Close()
}

// epoch is SOURCE_DATE_EPOCH, the reproducible-builds convention, or 0.
func epoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("image: SOURCE_DATE_EPOCH=%q: %w", s, err)
	}
	return time.Unix(n, 0).UTC(), nil
}

func main() {
	o := Options{}
	out := flag.String("out", "build/mooncake-image.oci.tar", "the OCI archive to write")
	flag.StringVar(&o.Binary, "binary", "build/image/mooncake", "static mooncake binary (CGO_ENABLED=0 go build ./cmd/mooncake)")
	flag.StringVar(&o.Arch, "arch", runtime.GOARCH, "image architecture (GOARCH naming)")
	flag.StringVar(&o.Tag, "tag", "latest", "ref name of the image in index.json")
	flag.StringVar(&o.User, "user", "65534:65534", "default user of the image (uid:gid)")
	verify := flag.Bool("verify", false, "check -out (digests, sizes, the binary in the layer) instead of writing it")
	flag.Parse()
	if err := run(o, *out, *verify); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(o Options, out string, verify bool) error {
	if verify {
		r, err := Verify(out)
		if err != nil {
			return err
		}
		fmt.Printf("%s: ok: manifest %s, layer %s (%d bytes), /mooncake %d bytes\n", out, r.Manifest, r.Layer.Digest, r.Layer.Size, r.BinarySize)
		return nil
	}
	t, err := epoch()
	if err != nil {
		return err
	}
	o.Time = t
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := Build(f, o); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("image: %w", err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	r, err := Verify(out)
	if err != nil {
		return fmt.Errorf("image: the archive written does not check: %w", err)
	}
	fmt.Printf("%s: %s (manifest %s)\n", out, o.Tag, r.Manifest)
	return nil
}

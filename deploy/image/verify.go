package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Report is what Verify found in an archive.
type Report struct {
	Manifest     string // the manifest's digest
	Config       imageConfig
	Layer        descriptor
	BinarySize   int64    // /mooncake's size in the layer
	BinarySHA256 string   // and its sha256, hex
	LayerFiles   []string // the layer's entries, in order
}

// Verify checks an OCI image-layout archive as a registry client would:
// oci-layout names version 1.0.0; every blob's file name is its sha256;
// index.json -> manifest -> config and layer descriptors match the blobs'
// digests and sizes; the layer's uncompressed digest is the config's
// diff_id; the layer holds an executable /mooncake; no blob is left
// unreferenced.
func Verify(path string) (Report, error) {
	var r Report
	f, err := os.Open(path)
	if err != nil {
		return r, err
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return r, fmt.Errorf("verify: reading %s: %w", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return r, fmt.Errorf("verify: reading %s: %w", h.Name, err)
		}
		files[h.Name] = b
	}
	var layout struct {
		ImageLayoutVersion string `json:"imageLayoutVersion"`
	}
	if err := strictJSON(files["oci-layout"], &layout); err != nil || layout.ImageLayoutVersion != "1.0.0" {
		return r, fmt.Errorf("verify: oci-layout: want imageLayoutVersion 1.0.0 (%q, %v)", layout.ImageLayoutVersion, err)
	}
	blobs := map[string][]byte{}
	for name, b := range files {
		hexName, ok := strings.CutPrefix(name, "blobs/sha256/")
		if !ok {
			continue
		}
		if got := digest(b); got != "sha256:"+hexName {
			return r, fmt.Errorf("verify: blob %s holds content of digest %s", name, got)
		}
		blobs["sha256:"+hexName] = b
	}
	used := map[string]bool{}
	fetch := func(what string, d descriptor, mediaType string) ([]byte, error) {
		if d.MediaType != mediaType {
			return nil, fmt.Errorf("verify: %s: media type %q, want %q", what, d.MediaType, mediaType)
		}
		b, ok := blobs[d.Digest]
		if !ok {
			return nil, fmt.Errorf("verify: %s: no blob %s", what, d.Digest)
		}
		if int64(len(b)) != d.Size {
			return nil, fmt.Errorf("verify: %s: descriptor size %d, blob %s is %d bytes", what, d.Size, d.Digest, len(b))
		}
		used[d.Digest] = true
		return b, nil
	}

	var idx index
	if err := strictJSON(files["index.json"], &idx); err != nil {
		return r, fmt.Errorf("verify: index.json: %w", err)
	}
	if idx.SchemaVersion != 2 || len(idx.Manifests) != 1 {
		return r, fmt.Errorf("verify: index.json: schemaVersion %d with %d manifests, want 2 with 1", idx.SchemaVersion, len(idx.Manifests))
	}
	mb, err := fetch("manifest", idx.Manifests[0], mediaManifest)
	if err != nil {
		return r, err
	}
	r.Manifest = idx.Manifests[0].Digest
	var m manifest
	if err := strictJSON(mb, &m); err != nil {
		return r, fmt.Errorf("verify: manifest: %w", err)
	}
	if m.SchemaVersion != 2 || m.MediaType != mediaManifest || len(m.Layers) != 1 {
		return r, fmt.Errorf("verify: manifest: schemaVersion %d, mediaType %q, %d layers: want 2, %q, 1", m.SchemaVersion, m.MediaType, len(m.Layers), mediaManifest)
	}
	cb, err := fetch("config", m.Config, mediaConfig)
	if err != nil {
		return r, err
	}
	if err := strictJSON(cb, &r.Config); err != nil {
		return r, fmt.Errorf("verify: config: %w", err)
	}
	if r.Config.OS != "linux" || r.Config.Architecture == "" || len(r.Config.Config.Entrypoint) == 0 || r.Config.Config.Entrypoint[0] != "/mooncake" {
		return r, fmt.Errorf("verify: config: os %q, architecture %q, entrypoint %q: want linux, an architecture, /mooncake", r.Config.OS, r.Config.Architecture, r.Config.Config.Entrypoint)
	}
	if len(r.Config.RootFS.DiffIDs) != len(m.Layers) {
		return r, fmt.Errorf("verify: config: %d diff_ids for %d layers", len(r.Config.RootFS.DiffIDs), len(m.Layers))
	}
	r.Layer = m.Layers[0]
	lb, err := fetch("layer", r.Layer, mediaLayerGz)
	if err != nil {
		return r, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(lb))
	if err != nil {
		return r, fmt.Errorf("verify: layer: %w", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return r, fmt.Errorf("verify: layer: %w", err)
	}
	if got := digest(raw); got != r.Config.RootFS.DiffIDs[0] {
		return r, fmt.Errorf("verify: layer: uncompressed digest %s, config's diff_id %s", got, r.Config.RootFS.DiffIDs[0])
	}
	if err := r.readLayer(raw); err != nil {
		return r, err
	}
	for d := range blobs {
		if !used[d] {
			return r, fmt.Errorf("verify: blob %s is referenced by nothing", d)
		}
	}
	return r, nil
}

// readLayer finds /mooncake in the layer: a regular file, executable, ELF.
func (r *Report) readLayer(raw []byte) error {
	tr := tar.NewReader(bytes.NewReader(raw))
	found := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("verify: layer tar: %w", err)
		}
		r.LayerFiles = append(r.LayerFiles, h.Name)
		if strings.TrimPrefix(h.Name, "/") != "mooncake" {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return fmt.Errorf("verify: layer: /mooncake: %w", err)
		}
		if h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 || !bytes.HasPrefix(b, []byte("\x7fELF")) {
			return fmt.Errorf("verify: layer: /mooncake is not an executable ELF file (type %c, mode %o)", h.Typeflag, h.Mode)
		}
		sum := sha256.Sum256(b)
		r.BinarySize, r.BinarySHA256, found = int64(len(b)), hex.EncodeToString(sum[:]), true
	}
	if !found {
		return errors.New("verify: layer: no /mooncake")
	}
	return nil
}

// strictJSON decodes b into v, refusing fields v does not have.
func strictJSON(b []byte, v any) error {
	if b == nil {
		return errors.New("missing")
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

package client

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// With Config.ReportExisting every kind of put of a key that exists fails
// with ObjectAlreadyExists and leaves the value stored as it was; an
// upsert still replaces it, and a client without the setting keeps
// Mooncake's silent success.
func TestReportExisting(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20, func(c *Config) { c.ReportExisting = true })
	quiet := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	v1, v2 := value(1, 5000), value(2, 7000)
	require.NoError(t, a.Put(ctx, "k", v1, nil))

	buf := value(3, 8192)
	require.NoError(t, a.RegisterBuffer(buf))
	for _, tc := range []struct {
		name string
		put  func() []error
	}{
		{"put", func() []error { return []error{a.Put(ctx, "k", v2, nil)} }},
		{"put from a registered buffer", func() []error { return []error{a.PutFrom(ctx, "k", buf[:100], nil)} }},
		// A batch: the existing key fails alone.
		{"batch", func() []error { return a.BatchPut(ctx, []string{"k", "fresh"}, [][]byte{v2, v2}, nil) }},
		{"parts", func() []error {
			return a.BatchPutFromParts(ctx, []string{"k"}, [][][]byte{{buf[:10], buf[10:20]}}, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := tc.put()
			assert.Equal(t, storepb.ObjectAlreadyExists, codeOf(errs[0]), "%v", errs[0])
			assert.ErrorIs(t, errs[0], storepb.ErrObjectAlreadyExists)
			for _, err := range errs[1:] {
				assert.NoError(t, err)
			}
			got, err := a.Get(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, v1, got, "the value stored stays")
		})
	}
	got, err := a.Get(ctx, "fresh")
	require.NoError(t, err)
	assert.Equal(t, v2, got)

	// Without the setting: success, nothing written.
	require.NoError(t, quiet.Put(ctx, "k", v2, nil))
	got, err = a.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, v1, got)
	// Upsert replaces either way.
	require.NoError(t, a.Upsert(ctx, "k", v2, nil))
	got, err = a.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, v2, got)
}

package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/crc32c"
)

func TestValueRoundTrip(t *testing.T) {
	id := ValueID{Writer: 3, Seq: 17}
	for _, size := range []int{MinValueSize("key"), MinValueSize("key") + 1, 16 << 10} {
		b, err := EncodeValue("key", id, size)
		require.NoError(t, err)
		require.Len(t, b, size)
		key, got, err := DecodeValue(b)
		require.NoError(t, err, size)
		assert.Equal(t, "key", key)
		assert.Equal(t, id, got)
	}
	// Two writes of one key differ all along, not only in the header.
	a, _ := EncodeValue("key", ValueID{1, 1}, 4096)
	b, _ := EncodeValue("key", ValueID{1, 2}, 4096)
	assert.NotEqual(t, a[2048:], b[2048:])
	// ...and in the store's checksum (CRC-32C of the whole value), which
	// the store's reads verify: a value ending with its own CRC-32C would
	// have the CRC-32C of every other one.
	assert.NotEqual(t, crc32c.Checksum(a), crc32c.Checksum(b))

	_, err := EncodeValue("key", id, MinValueSize("key")-1)
	assert.ErrorContains(t, err, "below")
	_, err = EncodeValue("key", ValueID{Writer: 1}, 100)
	assert.ErrorContains(t, err, "start at 1")
}

// Bytes that are not a whole value of this package are refused: a flipped
// bit, a torn value (its head from one write, its tail from another), a
// cut one, foreign bytes.
func TestDecodeValueRefuses(t *testing.T) {
	v, _ := EncodeValue("key", ValueID{1, 1}, 1024)
	other, _ := EncodeValue("key", ValueID{2, 5}, 1024)
	flipped := append([]byte(nil), v...)
	flipped[600] ^= 1
	torn := append(append([]byte(nil), v[:512]...), other[512:]...)
	for name, b := range map[string][]byte{
		"flipped bit": flipped,
		"torn":        torn,
		"cut":         v[:512],
		"foreign":     make([]byte, 1024),
		"empty":       nil,
		"short key":   v[:10],
	} {
		_, _, err := DecodeValue(b)
		assert.Error(t, err, name)
	}
}

func TestParseSchedule(t *testing.T) {
	cases := []struct {
		spec string
		want []Step
		err  string
	}{
		{"", nil, ""},
		{"none", nil, ""},
		{"kill-node@5s,kill-master@10s+2s", []Step{{Name: "kill-node", At: 5 * time.Second},
			{Name: "kill-master", At: 10 * time.Second, Hold: 2 * time.Second}}, ""},
		{"kill-node/7s", []Step{{Name: "kill-node", At: 7 * time.Second, Every: 7 * time.Second}}, ""},
		{"kill-master@3s/10s+1s", []Step{{Name: "kill-master", At: 3 * time.Second, Every: 10 * time.Second, Hold: time.Second}}, ""},
		{"kill-node", nil, "want name@time or name/period"},
		{"kill-node@soon", nil, `time "soon"`},
		{"kill-node@5s+0s", nil, "hold"},
		{"kill-node/0s", nil, "period"},
		{"@5s", nil, "no fault name"},
	}
	for _, tc := range cases {
		got, err := ParseSchedule(tc.spec)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.spec)
			continue
		}
		require.NoError(t, err, tc.spec)
		assert.Equal(t, tc.want, got, tc.spec)
		// A step prints as it parses.
		for _, s := range got {
			again, err := ParseSchedule(s.String())
			require.NoError(t, err)
			assert.Equal(t, []Step{s}, again)
		}
	}
}

func TestPlan(t *testing.T) {
	steps, err := ParseSchedule("kill-master@4s,kill-node/3s,late@20s")
	require.NoError(t, err)
	var got []string
	for _, in := range plan(steps, 10*time.Second) {
		got = append(got, in.step.Name+"@"+in.at.String())
	}
	assert.Equal(t, []string{"kill-node@3s", "kill-master@4s", "kill-node@6s", "kill-node@9s"}, got)
	assert.ErrorContains(t, Faults{"kill-node": FaultFunc(nil)}.Validate(steps), `no fault "kill-master" here (have: kill-node)`)
}

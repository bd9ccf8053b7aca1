package metadata

import (
	"bytes"
	"encoding/json"
	"testing"
)

// Descriptors and rpc_meta records come from the network (etcd, HTTP, the
// handshake socket), written by engines we do not control. The parsers must
// never panic, and whatever they accept must survive our own round trip:
// we republish what we parse.

func FuzzParseSegmentDesc(f *testing.F) {
	for _, s := range []string{
		mooncakeTCPDesc,
		`{"name":"a","protocol":["rdma","tcp"],"buffers":[]}`,
		`{"name":"a","protocol":"rdma","buffers":[{"name":"cuda:0","addr":1,"length":2,"rkey":[1,2],"lkey":[3,4]}]}`,
		`{"name":"a","protocol":"tcp","buffers":[],"mcgo_local":{"host_id":"h","pid":1,"start_time":2,"shared":[{"addr":1,"length":2,"fd":3}]}}`,
		`{"name":"a","protocol":"tcp","buffers":[],"mcgo_cuda_ipc":{"host_id":"h","pid":1,"buffers":[{"addr":4096,"length":8,"base":4096,"size":4096,"device":1,"handle":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="}]}}`,
		`{"name":"a","protocol":"tcp","tcp_data_port":15001,"buffers":[],"mcgo_tcp_data_addrs":["10.0.1.5:15001","[fd00::5]:15001"]}`,
		`{"name":"a","protocol":"tcp","tcp_data_port":15001,"mcgo_tcp_data_addrs":["10.0.1.5:0","nic2","10.0.1.5:015001",""]}`,
		`{"name":"a","protocol":null}`,
		`{"name":"a","buffers":[{"addr":18446744073709551615,"length":2}]}`,
		`{"name":"","tcp_data_port":70000}`,
		`{"name":"a"`,
		`null`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseSegmentDesc(b)
		if err != nil {
			return
		}
		d.ProtocolName()
		d.HasProtocol("tcp")
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatalf("marshal of parsed %q: %v", b, err)
		}
		d2, err := ParseSegmentDesc(out)
		if err != nil {
			t.Fatalf("reparse of %q (from %q): %v", out, b, err)
		}
		// After one trip the encoding is canonical: a second is identical.
		out2, err := json.Marshal(d2)
		if err != nil {
			t.Fatalf("marshal of reparsed %q: %v", out, err)
		}
		if !bytes.Equal(out, out2) {
			t.Fatalf("round trip not stable:\n%s\n%s", out, out2)
		}
	})
}

func FuzzParseRPCMeta(f *testing.F) {
	for _, s := range []string{
		`{"ip_or_host_name":"127.0.0.1","rpc_port":15001}`,
		`{"ip_or_host_name":"node-1.cluster.local","rpc_port":65535,"extra":[1]}`,
		`{"ip_or_host_name":"","rpc_port":1}`,
		`{"ip_or_host_name":"h","rpc_port":0}`,
		`{"ip_or_host_name":"h","rpc_port":1e2}`,
		`{"ip_or_host_name":"h"`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseRPCMeta(b)
		if err != nil {
			return
		}
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("marshal of parsed %q: %v", b, err)
		}
		m2, err := ParseRPCMeta(out)
		if err != nil {
			t.Fatalf("reparse of %q (from %q): %v", out, b, err)
		}
		if m2 != m {
			t.Fatalf("round trip changed %+v into %+v", m, m2)
		}
	})
}

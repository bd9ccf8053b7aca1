package client

import (
	"context"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// Exist reports whether key is readable. Like Mooncake's, it grants a
// lease on the object.
func (c *Client) Exist(ctx context.Context, key string) (bool, error) {
	ok, errs := c.BatchExist(ctx, []string{key})
	return ok[0], errs[0]
}

// BatchExist is Exist of many keys; an error is only for a key the master
// refused (invalid) or a failed call. A key whose lease this client holds
// (see Get) exists without asking: the lease keeps it.
func (c *Client) BatchExist(ctx context.Context, keys []string) ([]bool, []error) {
	ok, errs := make([]bool, len(keys)), make([]error, len(keys))
	ask := make([]int, 0, len(keys))
	now := time.Now()
	for i, k := range keys {
		if c.leases != nil && c.leases.get(k, now) != nil {
			ok[i] = true
			continue
		}
		ask = append(ask, i)
	}
	if len(ask) == 0 {
		return ok, errs
	}
	req := &storepb.BatchKeyRequest{ClientId: c.id, Keys: make([]string, len(ask))}
	for j, i := range ask {
		req.Keys[j] = keys[i]
	}
	var resp *storepb.BatchResult
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
		resp, err = rpc.BatchExistKey(ctx, req)
		return err
	})
	err = batchErr(err, len(resp.GetResults()), len(ask))
	for j, i := range ask {
		if err != nil {
			errs[i] = err
			continue
		}
		switch e := resp.Results[j].AsError(); {
		case e == nil:
			ok[i] = true
		case resp.Results[j].Code != int32(storepb.ObjectNotFound):
			errs[i] = e
		}
	}
	return ok, errs
}

// Size returns the length of key's value; like Get it leases the object.
// Within a lease this client holds (a Get or a GetInto that found its
// buffer too small took one) it answers without asking the master.
func (c *Client) Size(ctx context.Context, key string) (uint64, error) {
	if c.leases != nil {
		if e := c.leases.get(key, time.Now()); e != nil {
			return e.length, nil
		}
	}
	var resp *storepb.GetReplicaListResponse
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
		resp, err = rpc.GetReplicaList(ctx, &storepb.KeyRequest{ClientId: c.id, Key: key})
		return err
	})
	if err != nil {
		return 0, err
	}
	if err := resp.Result.AsError(); err != nil {
		return 0, err
	}
	return resp.ValueLength, nil
}

// Remove deletes key. A leased object (recently read) gives
// ObjectHasLease unless force.
func (c *Client) Remove(ctx context.Context, key string, force bool) error {
	return c.BatchRemove(ctx, []string{key}, force)[0]
}

// BatchRemove is Remove of many keys.
func (c *Client) BatchRemove(ctx context.Context, keys []string, force bool) []error {
	errs := make([]error, len(keys))
	if c.leases != nil {
		c.leases.drop(keys...)
	}
	var resp *storepb.BatchResult
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
		resp, err = rpc.BatchRemove(ctx, &storepb.BatchRemoveRequest{ClientId: c.id, Keys: keys, Force: force})
		return err
	})
	err = batchErr(err, len(resp.GetResults()), len(keys))
	for i := range keys {
		if errs[i] = err; err == nil {
			errs[i] = resp.Results[i].AsError()
		}
	}
	return errs
}

// RemoveAll removes every readable object (leased ones only with force)
// and returns how many.
func (c *Client) RemoveAll(ctx context.Context, force bool) (int, error) {
	return c.removeMany(ctx, func(ctx context.Context, rpc storepb.MasterClient) (*storepb.RemoveAllResponse, error) {
		return rpc.RemoveAll(ctx, &storepb.RemoveAllRequest{ClientId: c.id, Force: force})
	})
}

// RemoveByRegex removes the readable objects whose key the RE2 pattern
// expr matches anywhere in it ("^prefix" for a prefix; leased ones only
// with force) and returns how many. A pattern that does not compile, or
// an empty one, is INVALID_PARAMS.
func (c *Client) RemoveByRegex(ctx context.Context, expr string, force bool) (int, error) {
	return c.removeMany(ctx, func(ctx context.Context, rpc storepb.MasterClient) (*storepb.RemoveAllResponse, error) {
		return rpc.RemoveByRegex(ctx, &storepb.RemoveByRegexRequest{ClientId: c.id, Regex: expr, Force: force})
	})
}

func (c *Client) removeMany(ctx context.Context, call func(context.Context, storepb.MasterClient) (*storepb.RemoveAllResponse, error)) (int, error) {
	if c.leases != nil {
		c.leases.clear()
	}
	var resp *storepb.RemoveAllResponse
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) (err error) {
		resp, err = call(ctx, rpc)
		return err
	})
	if err != nil {
		return 0, err
	}
	return int(resp.Removed), resp.Result.AsError()
}

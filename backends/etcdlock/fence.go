package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard/driver"
)

// DefaultFencePrefix prefixes a resource's name to make its fence key.
const DefaultFencePrefix = "warden/fence/"

// Fence makes fenced writes to etcd (package fence): transactions that carry,
// beside the caller's comparisons and operations, the compare and update of
// the resource's fence key, so that etcd applies them together or not at
// all. A resource's fence key is the prefix (DefaultFencePrefix) followed by
// the resource's name; its value is the highest token accepted, in decimal,
// and it never expires.
type Fence struct {
	kv     clientv3.KV
	prefix string
}

// FenceOption configures a Fence.
type FenceOption func(*Fence)

// WithFencePrefix replaces DefaultFencePrefix.
func WithFencePrefix(prefix string) FenceOption { return func(f *Fence) { f.prefix = prefix } }

// NewFence returns a Fence on kv (a *clientv3.Client, or a namespaced KV).
func NewFence(kv clientv3.KV, opts ...FenceOption) (*Fence, error) {
	if kv == nil {
		return nil, fmt.Errorf("warden: etcdlock: %w: nil client", driver.ErrInvalidOption)
	}
	f := &Fence{kv: kv, prefix: DefaultFencePrefix}
	for _, o := range opts {
		o(f)
	}
	return f, nil
}

// Key returns the fence key of resource.
func (f *Fence) Key(resource string) string { return f.prefix + resource }

// Txn starts a fenced transaction under c, built as a clientv3.Txn is.
func (f *Fence) Txn(ctx context.Context, c fence.Claim) *FencedTxn {
	return &FencedTxn{f: f, ctx: ctx, claim: c}
}

// Advance checks and advances c's resource without writing: fence.Fencer.
func (f *Fence) Advance(ctx context.Context, c fence.Claim) error {
	_, err := f.Txn(ctx, c).Commit()
	return err
}

// Highest returns the highest token resource accepted, 0 if none.
func (f *Fence) Highest(ctx context.Context, resource string) (uint64, error) {
	resp, err := f.kv.Get(ctx, f.Key(resource))
	if err != nil {
		return 0, driver.Unavailable(ctx, fmt.Errorf("warden: etcdlock: fence %q: %w", resource, err))
	}
	high, _, err := fenceValue(resource, resp)
	return high, err
}

// FencedTxn is a transaction under a claim: If, Then and Else are the
// caller's, as in clientv3.Txn, and Commit adds the fence.
type FencedTxn struct {
	f              *Fence
	ctx            context.Context
	claim          fence.Claim
	cmps           []clientv3.Cmp
	thenOps, elses []clientv3.Op
}

// If adds comparisons; Then runs when they all hold, Else otherwise.
func (t *FencedTxn) If(cs ...clientv3.Cmp) *FencedTxn { t.cmps = append(t.cmps, cs...); return t }

// Then adds the operations run when the comparisons hold.
func (t *FencedTxn) Then(ops ...clientv3.Op) *FencedTxn {
	t.thenOps = append(t.thenOps, ops...)
	return t
}

// Else adds the operations run when a comparison fails.
func (t *FencedTxn) Else(ops ...clientv3.Op) *FencedTxn { t.elses = append(t.elses, ops...); return t }

// Commit runs the transaction when the claim is accepted and returns its
// response, as clientv3's Commit does (Succeeded: the caller's comparisons
// held). When the resource has accepted a higher token it runs nothing and
// returns an error wrapping fence.ErrStaleToken. When etcd refuses the
// transaction for what the caller put in it, Commit returns etcd's error
// (wrapping guard.ErrInvalidOption when the request is malformed), the
// fence unchanged. A transaction whose operations put or delete the fence
// key itself (a resource named as its data key under WithFencePrefix(""), a
// range delete over the prefix) is refused with guard.ErrInvalidOption.
//
// It reads the fence key, then sends one etcd transaction whose guard is
// that the fence key is unchanged since the read: it holds the caller's
// transaction nested, and the fence's new token when it grows. When another
// writer moved the fence in between, the transaction reads it again, and
// Commit tries again with what it read. The caller's comparisons decide only
// between Then and Else: the claim is accepted either way.
func (t *FencedTxn) Commit() (*clientv3.TxnResponse, error) {
	c, ctx := t.claim, t.ctx
	if err := c.Validate(); err != nil {
		return nil, err
	}
	key := t.f.Key(c.Resource)
	if writes(key, t.thenOps) || writes(key, t.elses) {
		// Deleting the fence would let every lower token write again.
		return nil, fmt.Errorf("warden: etcdlock: %w: fenced transaction on %q writes its fence key %q", driver.ErrInvalidOption, c.Resource, key)
	}
	resp, err := t.f.kv.Get(ctx, key)
	if err != nil {
		return nil, driver.Unavailable(ctx, fmt.Errorf("warden: etcdlock: fence %q: %w", c.Resource, err))
	}
	high, rev, err := fenceValue(c.Resource, resp)
	for err == nil {
		if c.Token < high {
			return nil, fence.Stale(c, high)
		}
		unchanged := clientv3.Compare(clientv3.ModRevision(key), "=", rev)
		if rev == 0 {
			unchanged = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		}
		then := []clientv3.Op{clientv3.OpTxn(t.cmps, t.thenOps, t.elses)}
		if c.Token > high {
			then = append(then, clientv3.OpPut(key, strconv.FormatUint(c.Token, 10)))
		}
		var tr *clientv3.TxnResponse
		tr, err = t.f.kv.Txn(ctx).If(unchanged).Then(then...).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return nil, txnError(ctx, c, err)
		}
		if tr.Succeeded {
			return (*clientv3.TxnResponse)(tr.Responses[0].GetResponseTxn()), nil
		}
		high, rev, err = fenceValue(c.Resource, (*clientv3.GetResponse)(tr.Responses[0].GetResponseRange()))
	}
	return nil, err
}

// writes reports whether one of ops, or of the transactions nested in
// them, puts or deletes key, alone or in a range.
func writes(key string, ops []clientv3.Op) bool {
	for _, op := range ops {
		if op.IsTxn() {
			_, then, elses := op.Txn()
			if writes(key, then) || writes(key, elses) {
				return true
			}
			continue
		}
		if !op.IsPut() && !op.IsDelete() {
			continue
		}
		from, end := string(op.KeyBytes()), string(op.RangeBytes())
		switch {
		case end == "":
			if key == from {
				return true
			}
		case end == "\x00": // from the key on
			if key >= from {
				return true
			}
		case from <= key && key < end:
			return true
		}
	}
	return false
}

// txnError is the error of a fenced transaction etcd did not apply. One it
// refused for what the caller put in it (an empty key, a key given twice, a
// lease that does not exist) would fail again: it is returned as etcd gave
// it, with driver.ErrInvalidOption for the malformed, rather than as the
// server being unavailable.
func txnError(ctx context.Context, c fence.Claim, err error) error {
	err = fmt.Errorf("warden: etcdlock: fenced transaction on %q: %w", c.Resource, err)
	var ee rpctypes.EtcdError
	switch {
	case !errors.As(err, &ee):
		return driver.Unavailable(ctx, err)
	case ee.Code() == codes.InvalidArgument:
		return fmt.Errorf("%w: %w", driver.ErrInvalidOption, err)
	case ee.Code() == codes.NotFound:
		return err
	}
	return driver.Unavailable(ctx, err)
}

// fenceValue is the token and modification revision a fence key's read
// found; zeros when the key does not exist.
func fenceValue(resource string, resp *clientv3.GetResponse) (token uint64, rev int64, err error) {
	if len(resp.Kvs) == 0 {
		return 0, 0, nil
	}
	kv := resp.Kvs[0]
	token, err = strconv.ParseUint(string(kv.Value), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("warden: etcdlock: %w: the fence of %q holds %q, not a token", driver.ErrUnavailable, resource, kv.Value)
	}
	return token, kv.ModRevision, nil
}

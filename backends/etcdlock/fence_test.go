package etcdlock

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/fence/fencetest"
	"github.com/warden-go/warden/guard/driver"
)

// fenceStore is the suite's register on Fence: the value and count of
// resource r under testPrefix+"fence/"+r.
type fenceStore struct {
	f      *Fence
	client *clientv3.Client
}

func fenceDataKey(r, what string) string { return testPrefix + "fence/" + r + "/" + what }

func (s fenceStore) Set(ctx context.Context, c fence.Claim, value string) error {
	_, err := s.f.Txn(ctx, c).Then(clientv3.OpPut(fenceDataKey(c.Resource, "value"), value)).Commit()
	return err
}

// Incr reads the count and writes it plus one if it is unchanged: the
// caller's own comparison, beside the fence's.
func (s fenceStore) Incr(ctx context.Context, c fence.Claim) error {
	k := fenceDataKey(c.Resource, "count")
	for {
		resp, err := s.client.Get(ctx, k)
		if err != nil {
			return err
		}
		var n int64
		var rev int64
		if len(resp.Kvs) > 0 {
			n, _ = strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
			rev = resp.Kvs[0].ModRevision
		}
		tr, err := s.f.Txn(ctx, c).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
			Then(clientv3.OpPut(k, strconv.FormatInt(n+1, 10))).Commit()
		if err != nil || tr.Succeeded {
			return err
		}
	}
}

func (s fenceStore) Get(ctx context.Context, r string) (fencetest.State, error) {
	resp, err := s.client.Txn(ctx).Then(clientv3.OpGet(fenceDataKey(r, "value")), clientv3.OpGet(fenceDataKey(r, "count")),
		clientv3.OpGet(s.f.Key(r))).Commit()
	if err != nil {
		return fencetest.State{}, err
	}
	var st fencetest.State
	val := func(i int) string {
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			return string(kvs[0].Value)
		}
		return ""
	}
	st.Value = val(0)
	if v := val(1); v != "" {
		st.Count, _ = strconv.ParseInt(v, 10, 64)
	}
	if v := val(2); v != "" {
		st.Highest, _ = strconv.ParseUint(v, 10, 64)
	}
	return st, nil
}

func newFenceStore(t testing.TB, c *clientv3.Client) fencetest.Store {
	f, err := NewFence(c, WithFencePrefix(testPrefix+"fences/"))
	if err != nil {
		t.Fatal(err)
	}
	return fenceStore{f: f, client: c}
}

func TestFenceConformance(t *testing.T) {
	eps := endpoints(t)
	fencetest.Run(t, fencetest.Backend{
		New: func(t testing.TB) fencetest.Store { return newFenceStore(t, newClient(t, eps)) },
		Through: func(t testing.TB, relay string) fencetest.Store {
			return newFenceStore(t, newClient(t, []string{relay}))
		},
		Upstream: eps[0],
	})
}

// TestFenceTxn: the caller's comparisons choose Then or Else under an
// accepted claim; a stale claim runs neither.
func TestFenceTxn(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, endpoints(t))
	f, err := NewFence(c, WithFencePrefix(testPrefix+"fences/"))
	if err != nil {
		t.Fatal(err)
	}
	r := name("fence-txn")
	k, other := fenceDataKey(r, "k"), fenceDataKey(r, "else")
	absent := clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
	tr, err := f.Txn(ctx, fence.Claim{Resource: r, Token: 5}).If(absent).Then(clientv3.OpPut(k, "1")).Else(clientv3.OpPut(other, "1")).Commit()
	if err != nil || !tr.Succeeded {
		t.Fatalf("first: %v %v", tr, err)
	}
	tr, err = f.Txn(ctx, fence.Claim{Resource: r, Token: 6}).If(absent).Then(clientv3.OpPut(k, "2")).Else(clientv3.OpPut(other, "2")).Commit()
	if err != nil || tr.Succeeded {
		t.Fatalf("second: %v %v, want Else", tr, err)
	}
	if h, err := f.Highest(ctx, r); err != nil || h != 6 {
		t.Fatalf("highest %d %v, want 6 (accepted though the caller's comparison failed)", h, err)
	}
	_, err = f.Txn(ctx, fence.Claim{Resource: r, Token: 5}).Then(clientv3.OpPut(k, "stale")).Else(clientv3.OpPut(other, "stale")).Commit()
	if !errors.Is(err, fence.ErrStaleToken) || fence.Highest(err) != 6 {
		t.Fatalf("stale: %v", err)
	}
	for key, want := range map[string]string{k: "1", other: "2"} {
		if resp, err := c.Get(ctx, key); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != want {
			t.Errorf("%s: %v %v, want %q", key, resp, err, want)
		}
	}
}

// TestFenceTxnCallerMistakes: a transaction etcd refuses for what the
// caller put in it (an empty key, a key given twice, too many operations,
// a lease that does not exist) applies nothing and says so, instead of
// reporting the server unavailable: a retry would fail the same way.
func TestFenceTxnCallerMistakes(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, endpoints(t))
	f, err := NewFence(c, WithFencePrefix(testPrefix+"fences/"))
	if err != nil {
		t.Fatal(err)
	}
	r := name("fence-mistakes")
	k := fenceDataKey(r, "k")
	many := make([]clientv3.Op, 1000)
	for i := range many {
		many[i] = clientv3.OpPut(fenceDataKey(r, strconv.Itoa(i)), "x")
	}
	claim := fence.Claim{Resource: r, Token: 5}
	for what, ops := range map[string][]clientv3.Op{
		"an empty key":        {clientv3.OpPut("", "x")},
		"a key twice":         {clientv3.OpPut(k, "x"), clientv3.OpPut(k, "y")},
		"the fence key":       {clientv3.OpPut(f.Key(r), "1")},
		"too many operations": many,
	} {
		if _, err := f.Txn(ctx, claim).Then(ops...).Commit(); !errors.Is(err, driver.ErrInvalidOption) || errors.Is(err, driver.ErrUnavailable) {
			t.Errorf("%s: %v, want ErrInvalidOption", what, err)
		}
	}
	_, err = f.Txn(ctx, claim).Then(clientv3.OpPut(k, "x", clientv3.WithLease(1))).Commit()
	if !errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("a missing lease: %v, want rpctypes.ErrLeaseNotFound", err)
	}
	if h, err := f.Highest(ctx, r); err != nil || h != 0 {
		t.Errorf("fence at %d (%v) after refused transactions, want none", h, err)
	}
}

// TestFenceTxnRefusesItsOwnKey: a fenced transaction that would put or
// delete the resource's fence key itself (a resource named as its data key
// under WithFencePrefix(""), a range delete over the fence prefix) is
// refused before it reaches etcd: deleting the fence would have let every
// lower token write again.
func TestFenceTxnRefusesItsOwnKey(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, endpoints(t))
	f, err := NewFence(c, WithFencePrefix(testPrefix+"fences/"))
	if err != nil {
		t.Fatal(err)
	}
	r := name("fence-own")
	key := f.Key(r)
	claim := fence.Claim{Resource: r, Token: 10}
	if _, err := f.Txn(ctx, claim).Commit(); err != nil {
		t.Fatal(err)
	}
	for what, op := range map[string]clientv3.Op{
		"a delete of it":         clientv3.OpDelete(key),
		"a range delete over it": clientv3.OpDelete(testPrefix+"fences/", clientv3.WithPrefix()),
		"a put of it":            clientv3.OpPut(key, "1"),
		"a nested delete of it":  clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpDelete(key)}, nil),
	} {
		if _, err := f.Txn(ctx, claim).Then(op).Commit(); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("%s in Then: %v, want ErrInvalidOption", what, err)
		}
		if _, err := f.Txn(ctx, claim).Else(op).Commit(); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("%s in Else: %v, want ErrInvalidOption", what, err)
		}
	}
	if _, err := f.Txn(ctx, fence.Claim{Resource: r, Token: 9}).Commit(); !errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("a lower token after the refused transactions: %v, want ErrStaleToken", err)
	}
}

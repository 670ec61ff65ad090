package zklock

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/fence/fencetest"
	"github.com/warden-go/warden/guard/driver"
)

const fenceTestRoot = "/warden-test/fences"

// fenceStore is the suite's register on Fence: the value and count of
// resource r in nodes beside its fence node.
type fenceStore struct {
	f    *Fence
	conn *zk.Conn
}

func (s fenceStore) node(r, what string) string {
	return fenceTestRoot + "-data/" + url.PathEscape(r) + "-" + what
}

// write sets node to data under c, creating it when missing; build makes
// the operation from what the node holds and its version.
func (s fenceStore) write(ctx context.Context, c fence.Claim, node string, build func(old []byte, version int32) []byte) error {
	for {
		old, stat, err := s.conn.Get(node)
		var op any
		switch {
		case errors.Is(err, zk.ErrNoNode):
			if err := s.ensure(); err != nil {
				return err
			}
			op = &zk.CreateRequest{Path: node, Data: build(nil, -1), Acl: zk.WorldACL(zk.PermAll)}
		case err != nil:
			return err
		default:
			op = &zk.SetDataRequest{Path: node, Data: build(old, stat.Version), Version: stat.Version}
		}
		_, err = s.f.Multi(ctx, c, op)
		if errors.Is(err, zk.ErrNodeExists) || errors.Is(err, zk.ErrBadVersion) {
			continue // the data moved: the caller's own check, read again
		}
		return err
	}
}

func (s fenceStore) ensure() error {
	_, err := s.conn.Create(fenceTestRoot+"-data", nil, zk.FlagPersistent, zk.WorldACL(zk.PermAll))
	if errors.Is(err, zk.ErrNoNode) {
		if _, err = s.conn.Create("/warden-test", nil, zk.FlagPersistent, zk.WorldACL(zk.PermAll)); err == nil || errors.Is(err, zk.ErrNodeExists) {
			return s.ensure()
		}
	}
	if errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	return err
}

func (s fenceStore) Set(ctx context.Context, c fence.Claim, value string) error {
	return s.write(ctx, c, s.node(c.Resource, "value"), func([]byte, int32) []byte { return []byte(value) })
}

func (s fenceStore) Incr(ctx context.Context, c fence.Claim) error {
	return s.write(ctx, c, s.node(c.Resource, "count"), func(old []byte, _ int32) []byte {
		n, _ := strconv.ParseInt(string(old), 10, 64)
		return []byte(strconv.FormatInt(n+1, 10))
	})
}

// Get reads the fence, the data and the fence again, until the fence's
// version did not move: every accepted write sets the fence, so the data
// read in between is one state.
func (s fenceStore) Get(ctx context.Context, r string) (fencetest.State, error) {
	for {
		high, v1, err := s.f.Highest(ctx, r)
		if err != nil {
			return fencetest.State{}, err
		}
		st := fencetest.State{Highest: high}
		for i, what := range []string{"value", "count"} {
			data, _, err := s.conn.Get(s.node(r, what))
			if errors.Is(err, zk.ErrNoNode) {
				continue
			}
			if err != nil {
				return st, err
			}
			if i == 0 {
				st.Value = string(data)
			} else {
				st.Count, _ = strconv.ParseInt(string(data), 10, 64)
			}
		}
		if _, v2, err := s.f.Highest(ctx, r); err != nil || v1 == v2 {
			return st, err
		}
	}
}

func newFenceStore(t testing.TB, addrs []string) fencetest.Store {
	conn, _, err := zk.Connect(addrs, testSession, zk.WithLogger(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	f, err := NewFence(conn, WithFenceRoot(fenceTestRoot))
	if err != nil {
		t.Fatal(err)
	}
	return fenceStore{f: f, conn: conn}
}

func TestFenceConformance(t *testing.T) {
	addrs := servers(t)
	fencetest.Run(t, fencetest.Backend{
		New:      func(t testing.TB) fencetest.Store { return newFenceStore(t, addrs) },
		Through:  func(t testing.TB, relay string) fencetest.Store { return newFenceStore(t, []string{relay}) },
		Upstream: addrs[0],
	})
}

// TestFenceMulti: a refused operation of the caller's leaves the fence where
// it was; a stale claim applies nothing.
func TestFenceMulti(t *testing.T) {
	ctx := context.Background()
	s := newFenceStore(t, servers(t)).(fenceStore)
	r := "fence-multi/" + strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := s.Set(ctx, fence.Claim{Resource: r, Token: 5}, "a"); err != nil {
		t.Fatal(err)
	}
	node := s.node(r, "value")
	_, err := s.f.Multi(ctx, fence.Claim{Resource: r, Token: 8}, &zk.SetDataRequest{Path: node, Data: []byte("b"), Version: 99})
	if !errors.Is(err, zk.ErrBadVersion) {
		t.Fatalf("a refused operation: %v, want zk.ErrBadVersion", err)
	}
	if high, _, _ := s.f.Highest(ctx, r); high != 5 {
		t.Fatalf("fence at %d after a refused multi, want 5", high)
	}
	_, err = s.f.Multi(ctx, fence.Claim{Resource: r, Token: 4}, &zk.SetDataRequest{Path: node, Data: []byte("stale"), Version: -1})
	if !errors.Is(err, fence.ErrStaleToken) || fence.Highest(err) != 5 {
		t.Fatalf("stale: %v", err)
	}
	if st, err := s.Get(ctx, r); err != nil || st.Value != "a" {
		t.Fatalf("after a stale multi: %+v %v", st, err)
	}
	if _, err := NewFence(s.conn, WithFenceRoot("relative")); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("relative root: %v", err)
	}
}

// TestFenceOddResources: every resource a claim may name has a fence node of
// its own, "." and ".." among them (which ZooKeeper refuses as node names),
// and names that escape alike stay apart.
func TestFenceOddResources(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newFenceStore(t, servers(t)).(fenceStore)
	root := "fence-odd-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	f, err := NewFence(s.conn, WithFenceRoot(fenceTestRoot+"/"+root))
	if err != nil {
		t.Fatal(err)
	}
	names := []string{".", "..", "%2E", "%2E%2E", "a/b", "a%2Fb", "a ", "a", "a\x00b", "\xff", "..."}
	for i, r := range names {
		if err := f.Advance(ctx, fence.Claim{Resource: r, Token: uint64(100 + i)}); err != nil {
			t.Fatalf("Advance(%q): %v", r, err)
		}
	}
	for i, r := range names {
		if high, _, err := f.Highest(ctx, r); err != nil || high != uint64(100+i) {
			t.Errorf("Highest(%q) = %d, %v; want %d, its own", r, high, err, 100+i)
		}
	}
}

// TestFenceMultiRefusesBadOps: an operation Multi cannot send (another
// type, a value rather than a pointer, a nil one) is the caller's mistake,
// refused with ErrInvalidOption before any round trip, not reported as the
// server being unavailable.
func TestFenceMultiRefusesBadOps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newFenceStore(t, servers(t)).(fenceStore)
	r := "fence-badops/" + strconv.FormatInt(time.Now().UnixNano(), 10)
	c := fence.Claim{Resource: r, Token: 3}
	for _, op := range []any{"set", zk.CreateRequest{Path: "/x"}, (*zk.CreateRequest)(nil), (*zk.SetDataRequest)(nil),
		(*zk.DeleteRequest)(nil), (*zk.CheckVersionRequest)(nil), nil} {
		if _, err := s.f.Multi(ctx, c, op); !errors.Is(err, driver.ErrInvalidOption) || errors.Is(err, driver.ErrUnavailable) {
			t.Errorf("op %#v: %v, want ErrInvalidOption", op, err)
		}
	}
	if high, _, err := s.f.Highest(ctx, r); err != nil || high != 0 {
		t.Errorf("fence at %d (%v) after refused multis, want none", high, err)
	}
}

// TestFenceMultiRefusesItsOwnNode: a multi whose operations would delete or
// set the resource's fence node itself is refused before it reaches the
// server: deleting the fence would have let every lower token write again.
func TestFenceMultiRefusesItsOwnNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newFenceStore(t, servers(t)).(fenceStore)
	r := "fence-own/" + strconv.FormatInt(time.Now().UnixNano(), 10)
	claim := fence.Claim{Resource: r, Token: 10}
	if err := s.f.Advance(ctx, claim); err != nil {
		t.Fatal(err)
	}
	path := s.f.Path(r)
	for _, op := range []any{&zk.DeleteRequest{Path: path, Version: -1}, &zk.SetDataRequest{Path: path, Data: []byte("1"), Version: -1},
		&zk.CreateRequest{Path: path, Acl: zk.WorldACL(zk.PermAll)}} {
		if _, err := s.f.Multi(ctx, claim, op); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("%T of the fence node: %v, want ErrInvalidOption", op, err)
		}
	}
	if err := s.f.Advance(ctx, fence.Claim{Resource: r, Token: 9}); !errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("a lower token after the refused multis: %v, want ErrStaleToken", err)
	}
}

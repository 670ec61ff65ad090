package redislock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/fence/fencetest"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// fenceStore is the suite's register on Fence: the value and count of
// resource r at r+":value" and r+":count", in the slot of r's hash tag.
type fenceStore struct {
	f      *Fence
	client goredis.Cmdable
}

func (s fenceStore) Set(ctx context.Context, c fence.Claim, value string) error {
	return s.f.Set(ctx, c, c.Resource+":value", value, 0)
}

func (s fenceStore) Incr(ctx context.Context, c fence.Claim) error {
	_, err := s.f.IncrBy(ctx, c, c.Resource+":count", 1)
	if errors.Is(err, ErrReplyLost) {
		return nil
	}
	return err
}

func (s fenceStore) Get(ctx context.Context, r string) (fencetest.State, error) {
	// One transaction, so that the data and the fence are read at one point.
	var vs *goredis.SliceCmd
	var high *goredis.StringCmd
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		vs = p.MGet(ctx, r+":value", r+":count")
		high = p.HGet(ctx, s.f.Key(r), "t")
		return nil
	})
	if err != nil && !errors.Is(err, goredis.Nil) {
		return fencetest.State{}, err
	}
	var st fencetest.State
	if v, ok := vs.Val()[0].(string); ok {
		st.Value = v
	}
	if v, ok := vs.Val()[1].(string); ok {
		if st.Count, err = strconv.ParseInt(v, 10, 64); err != nil {
			return st, err
		}
	}
	if h := high.Val(); h != "" {
		if st.Highest, err = strconv.ParseUint(h, 10, 64); err != nil {
			return st, err
		}
	}
	return st, nil
}

func newFenceStore(t testing.TB, c goredis.Cmdable) fencetest.Store {
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	return fenceStore{f: f, client: c}
}

// fenceTag names the suite's resources with a hash tag, as a Cluster needs.
func fenceTag(name string) string { return "{" + name + "}" }

func TestFenceConformance(t *testing.T) {
	addr := drivertest.Addr(t, addrEnv, addrDefault)
	fencetest.Run(t, fencetest.Backend{
		New: func(t testing.TB) fencetest.Store { return newFenceStore(t, newClient(t)) },
		Through: func(t testing.TB, relay string) fencetest.Store {
			// go-redis's own retries (MaxRetries 3 by default) resend a call
			// whose connection broke: the fence's write ids must absorb them.
			c := goredis.NewClient(&goredis.Options{Addr: relay})
			t.Cleanup(func() { c.Close() })
			return newFenceStore(t, c)
		},
		Upstream: addr,
		Resource: fenceTag,
	})
}

// TestFenceWrites: HSet, Del and the caller's own script, fenced; a stale
// one changes nothing.
func TestFenceWrites(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	r := fenceTag("fence-writes/" + strconv.FormatInt(time.Now().UnixNano(), 10))
	h, k := r+":h", r+":k"
	fresh, stale := fence.Claim{Resource: r, Token: 10}, fence.Claim{Resource: r, Token: 9}
	if err := f.HSet(ctx, fresh, h, "a", "1", "b", "2"); err != nil {
		t.Fatal(err)
	}
	got, err := f.Eval(ctx, fresh, "redis.call('SET', KEYS[1], ARGV[1]) return #KEYS + #ARGV", []string{k}, "x")
	if err != nil || got != int64(2) {
		t.Fatalf("Eval: %v %v, want 2 (its own KEYS and ARGV only)", got, err)
	}
	if _, err := f.Eval(ctx, stale, "return redis.call('DEL', KEYS[1])", []string{k}); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("stale Eval: %v", err)
	}
	if err := f.Del(ctx, stale, h); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("stale Del: %v", err)
	}
	if n := c.Exists(ctx, h, k).Val(); n != 2 {
		t.Fatalf("after stale deletes, %d of 2 keys exist", n)
	}
	if err := f.Del(ctx, fresh, h, k); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, h, k).Val(); n != 0 {
		t.Fatalf("after Del, %d keys exist", n)
	}
	if err := f.HSet(ctx, fresh, h, "odd"); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("HSet with an odd count: %v", err)
	}
}

// TestFenceResentApplied: the same call sent twice (as go-redis resends one
// whose connection broke after the server ran it) is applied once.
// Before the write ids, the count reached 2.
func TestFenceResentApplied(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	r := fenceTag("fence-resent/" + strconv.FormatInt(time.Now().UnixNano(), 10))
	keys := []string{f.Key(r), r + ":count"}
	args := []any{"7", "00112233aabbccdd", "incrby", 1}
	if n, err := f.write.Run(ctx, c, keys, args...).Int64(); err != nil || n != 1 {
		t.Fatalf("first send: %d %v", n, err)
	}
	if err := f.write.Run(ctx, c, keys, args...).Err(); err == nil || !strings.HasPrefix(err.Error(), "WARDEN_APPLIED ") {
		t.Fatalf("resent: %v, want WARDEN_APPLIED", err)
	}
	if n, _ := c.Get(ctx, r+":count").Int(); n != 1 {
		t.Fatalf("count %d after a resent increment, want 1", n)
	}
}

// TestFenceReplyLost: IncrBy resent after a lost reply reports ErrReplyLost,
// and Set reports success.
func TestFenceReplyLost(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	r := fenceTag("fence-lost/" + strconv.FormatInt(time.Now().UnixNano(), 10))
	// A script that always finds its id: what a resent call sees.
	f.write = goredis.NewScript("return redis.error_reply('WARDEN_APPLIED already')")
	if _, err := f.IncrBy(ctx, fence.Claim{Resource: r, Token: 1}, r+":n", 1); !errors.Is(err, ErrReplyLost) {
		t.Errorf("IncrBy: %v, want ErrReplyLost", err)
	}
	if err := f.Set(ctx, fence.Claim{Resource: r, Token: 1}, r+":v", "x", 0); err != nil {
		t.Errorf("Set: %v, want nil", err)
	}
}

// TestFenceFailedWriteChangesNothing: a write Redis refuses (INCRBY of a
// value that is not an integer, HSET of a key that is not a hash) leaves
// the fence where it was, as a stale one does: the check, the advance and
// the write are one, and the write did not happen.
func TestFenceFailedWriteChangesNothing(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	r := fenceTag("fence-failed/" + strconv.FormatInt(time.Now().UnixNano(), 10))
	k := r + ":k"
	if err := f.Set(ctx, fence.Claim{Resource: r, Token: 5}, k, "not a number", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.IncrBy(ctx, fence.Claim{Resource: r, Token: 9}, k, 1); err == nil || errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("IncrBy of a string: %v, want Redis's error", err)
	}
	if err := f.HSet(ctx, fence.Claim{Resource: r, Token: 8}, k, "a", "1"); err == nil || errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("HSet of a string: %v, want Redis's error", err)
	}
	if high, err := f.Highest(ctx, r); err != nil || high != 5 {
		t.Fatalf("fence at %d (%v) after two failed writes, want 5", high, err)
	}
	if err := f.Set(ctx, fence.Claim{Resource: r, Token: 6}, k, "six", 0); err != nil {
		t.Fatalf("a write above the last accepted token: %v", err)
	}
}

// TestFenceResentAfterManyWrites: a call resent after its connection broke
// is applied once even when the resource took more writes in between than
// the fence keeps ids of (32): a busy resource, a resend after go-redis's
// backoff.
func TestFenceResentAfterManyWrites(t *testing.T) {
	t.Skip("defect: the fence remembers the ids of its latest 32 writes only; a resend that 32 other writes of the resource overtook is applied again (count 2)")
	ctx := context.Background()
	c := newClient(t)
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	r := fenceTag("fence-resent-late/" + strconv.FormatInt(time.Now().UnixNano(), 10))
	keys := []string{f.Key(r), r + ":count"}
	args := []any{"7", "00112233aabbccdd", "incrby", 1}
	if err := f.write.Run(ctx, c, keys, args...).Err(); err != nil {
		t.Fatalf("first send: %v", err)
	}
	for i := range 32 {
		if err := f.Set(ctx, fence.Claim{Resource: r, Token: 7}, r+":other", i, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.write.Run(ctx, c, keys, args...).Err(); err == nil || !strings.HasPrefix(err.Error(), "WARDEN_APPLIED ") {
		t.Errorf("resent after 32 other writes: %v, want WARDEN_APPLIED", err)
	}
	if n, _ := c.Get(ctx, r+":count").Int(); n != 1 {
		t.Fatalf("count %d after a resent increment, want 1", n)
	}
}

// TestFenceRefusesItsOwnKey: a fenced write to the resource's fence key
// itself (a resource named as its data key under WithFencePrefix(""), say)
// is refused before it reaches Redis: deleting the fence would have let
// every lower token write again, overwriting it would have broken it.
func TestFenceRefusesItsOwnKey(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	f, err := NewFence(c, WithFencePrefix(""))
	if err != nil {
		t.Fatal(err)
	}
	r := fenceTag("fence-own/" + strconv.FormatInt(time.Now().UnixNano(), 10))
	claim := fence.Claim{Resource: r, Token: 10}
	if err := f.Set(ctx, claim, r+":other", "x", 0); err != nil {
		t.Fatal(err)
	}
	for what, write := range map[string]func() error{
		"Set":    func() error { return f.Set(ctx, claim, r, "x", 0) },
		"Del":    func() error { return f.Del(ctx, claim, r+":other", r) },
		"HSet":   func() error { return f.HSet(ctx, claim, r, "t", "1") },
		"IncrBy": func() error { _, err := f.IncrBy(ctx, claim, r, 1); return err },
		"Eval": func() error {
			_, err := f.Eval(ctx, claim, "return redis.call('DEL', KEYS[1])", []string{r})
			return err
		},
	} {
		if err := write(); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("%s of the fence key: %v, want ErrInvalidOption", what, err)
		}
	}
	if err := f.Set(ctx, fence.Claim{Resource: r, Token: 9}, r+":other", "stale", 0); !errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("a lower token after the refused writes: %v, want ErrStaleToken", err)
	}
}

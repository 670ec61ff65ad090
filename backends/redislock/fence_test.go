package redislock

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
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
			// go-redis's own retries (MaxRetries 3 by default) would resend a
			// call whose connection broke: the Fence's writes must not be.
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

// cutReply relays one client's connections to the Redis server at addr.
// Armed, it holds the next reply the server sends, runs between, and cuts
// the connection instead of delivering it: a write the server applied
// whose reply the client never got, with other writes landing before the
// client could send it again.
type cutReply struct {
	ln      net.Listener
	addr    string
	between chan func()
}

func newCutReply(t *testing.T, addr string) *cutReply {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &cutReply{ln: ln, addr: addr, between: make(chan func(), 1)}
	t.Cleanup(func() { ln.Close() })
	go r.serve()
	return r
}

func (r *cutReply) serve() {
	for {
		client, err := r.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", r.addr)
		if err != nil {
			client.Close()
			continue
		}
		go func() { io.Copy(server, client); server.Close() }()
		go func() {
			defer client.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 {
					select {
					case fn := <-r.between:
						fn()
						client.(*net.TCPConn).SetLinger(0)
						return
					default:
					}
					if _, err := client.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// fenceCut returns a Fence whose client reaches Redis through a cutReply,
// connected and with the fence's script loaded, and a direct client.
func fenceCut(t *testing.T) (*Fence, *cutReply, *goredis.Client) {
	direct := newClient(t)
	cut := newCutReply(t, drivertest.Addr(t, addrEnv, addrDefault))
	c := goredis.NewClient(&goredis.Options{Addr: cut.ln.Addr().String()})
	t.Cleanup(func() { c.Close() })
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := goredis.NewScript(fenceCheckSrc+fenceWriteSrc).Load(ctx, direct).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	return f, cut, direct
}

// TestFenceResentAfterManyWrites: a fenced increment the server applied
// and whose reply was lost is not applied again, however many writes of
// the resource land before go-redis would have resent it (32 here: the
// ids of its latest writes the fence once kept, to recognise a resend,
// were 32), and the caller learns that its outcome is unknown.
func TestFenceResentAfterManyWrites(t *testing.T) {
	ctx := context.Background()
	f, cut, direct := fenceCut(t)
	other, err := NewFence(direct)
	if err != nil {
		t.Fatal(err)
	}
	r := fenceTag("fence-resent-late/" + strconv.FormatInt(time.Now().UnixNano(), 10))
	claim := fence.Claim{Resource: r, Token: 7}
	cut.between <- func() {
		for i := range 32 {
			if err := other.Set(ctx, claim, r+":other", i, 0); err != nil {
				t.Error(err)
			}
		}
	}
	_, err = f.IncrBy(ctx, claim, r+":count", 1)
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("increment whose reply was cut: %v, want ErrOutcomeUnknown and ErrUnavailable", err)
	}
	if n, _ := direct.Get(ctx, r+":count").Int(); n != 1 {
		t.Fatalf("count %d after an increment whose reply was cut, want 1", n)
	}
}

// TestFenceResentAfterNewerHolder: a fenced write the server applied and
// whose reply was lost is not reported stale when a newer holder wrote (32
// times, past the fence's former memory of write ids) before it could have
// been resent: it was applied, and the caller must not take it for refused.
func TestFenceResentAfterNewerHolder(t *testing.T) {
	ctx := context.Background()
	f, cut, direct := fenceCut(t)
	other, err := NewFence(direct)
	if err != nil {
		t.Fatal(err)
	}
	r := fenceTag("fence-resent-newer/" + strconv.FormatInt(time.Now().UnixNano(), 10))
	cut.between <- func() {
		for i := range 32 {
			if err := other.Set(ctx, fence.Claim{Resource: r, Token: 8}, r+":other", i, 0); err != nil {
				t.Error(err)
			}
		}
	}
	err = f.Set(ctx, fence.Claim{Resource: r, Token: 7}, r+":value", "seven", 0)
	if errors.Is(err, fence.ErrStaleToken) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Errorf("write whose reply was cut, then a newer holder's: %v, want ErrOutcomeUnknown, not stale", err)
	}
	if v, _ := direct.Get(ctx, r+":value").Result(); v != "seven" {
		t.Fatalf("value %q, want the write applied (seven)", v)
	}
}

// TestFenceUnsentIsNotUnknown: a write that never left the client (no
// server listens, its context ended before) is known not applied: not
// ErrOutcomeUnknown, and matching driver.ErrNotSent.
func TestFenceUnsentIsNotUnknown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Set(context.Background(), fence.Claim{Resource: "{fence-unsent}", Token: 1}, "{fence-unsent}:v", "x", 0)
	if !errors.Is(err, driver.ErrUnavailable) || !errors.Is(err, driver.ErrNotSent) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("write to a closed port: %v, want ErrUnavailable and ErrNotSent, not ErrOutcomeUnknown", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = f.Set(ctx, fence.Claim{Resource: "{fence-unsent}", Token: 1}, "{fence-unsent}:v", "x", 0)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, driver.ErrNotSent) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("write with a cancelled context: %v, want context.Canceled and ErrNotSent, not ErrOutcomeUnknown", err)
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

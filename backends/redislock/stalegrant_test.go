package redislock

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// TestStaleGrantRefused: a release hands the lock to a waiter, whose grant
// message is held on its way (the subscription's connection keeps no order
// with the attempts'); meanwhile the lock is forced away and another
// contender takes it, and an attempt of the waiter is refused. When the
// message at last comes, the waiter must not take that old grant for its
// own, and later gets the lock from the other holder's release, with a
// greater token.
func TestStaleGrantRefused(t *testing.T) {
	admin, addr := privateClient(t)
	p := newSubHoldingProxy(t, addr)
	holder := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}))
	other := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}))
	waiter := newLocker(t, goredis.NewClient(&goredis.Options{Addr: p.addr()}))
	ctx := context.Background()
	const key, ttl = "stale-grant", 10 * time.Second
	held, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Owner: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		le  driver.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		le, err := waiter.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Wait: true, Owner: "waiter"})
		got <- result{le, err}
	}()
	recorded := func() bool { n, _ := admin.ZCard(ctx, namesOf(key).waiters()).Result(); return n == 1 }
	eventually(t, "the waiter is recorded", recorded)
	eventually(t, "the waiter's Locker is subscribed", func() bool {
		subs, err := admin.PubSubNumSub(ctx, waiter.wake).Result()
		return err == nil && subs[waiter.wake] == 1
	})

	p.holdSubs(true)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the grant message is held", func() bool { return p.held() > 0 })
	if _, err := holder.ForceRelease(ctx, key, driver.ReleaseTarget{AnyHolder: true}); err != nil {
		t.Fatal(err)
	}
	x, err := other.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Owner: "x"})
	if err != nil {
		t.Fatal(err)
	}
	// The grant took the waiter's record out; a refused attempt (within a
	// quarter of the TTL, as for a lost message) puts it back.
	eventually(t, "a refused attempt of the waiter", recorded)
	sent := p.commands()
	p.holdSubs(false)
	// The old grant wakes the waiter, which either takes it (the defect)
	// or tries again and is refused.
	eventually(t, "the waiter answers the old grant", func() bool {
		select {
		case r := <-got:
			if r.err == nil {
				in, _ := holder.Inspect(ctx, key)
				t.Fatalf("the waiter took a grant made before its refused attempt: token %d while x holds token %d (%+v)", r.le.Token(), x.Token(), in)
			}
			t.Fatalf("the waiter: %v", r.err)
		default:
		}
		return p.held() == 0 && p.commands() > sent
	})
	if err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.le.Token() <= x.Token() {
			t.Errorf("the waiter's token %d, not past x's %d", r.le.Token(), x.Token())
		}
		if err := r.le.Release(ctx); err != nil {
			t.Errorf("the waiter's release: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter did not get the lock x released")
	}
}

// subHoldingProxy forwards connections to a Redis server, holding what the
// server sends on subscription connections while told to, and counting the
// writes clients send on the others.
type subHoldingProxy struct {
	ln      net.Listener
	mu      sync.Mutex
	hold    bool
	pending int
	resume  *sync.Cond
	conns   []net.Conn
	sends   atomic.Int64
}

func newSubHoldingProxy(t *testing.T, target string) *subHoldingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &subHoldingProxy{ln: ln}
	p.resume = sync.NewCond(&p.mu)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		p.hold = false
		p.resume.Broadcast()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		conns.Wait()
	})
	conns.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			var sub atomic.Bool
			conns.Go(func() {
				defer s.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if bytes.Contains(bytes.ToLower(buf[:n]), []byte("subscribe")) {
							sub.Store(true)
						} else if !sub.Load() {
							p.sends.Add(1)
						}
						if _, err := s.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
			conns.Go(func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && sub.Load() {
						p.wait()
					}
					if n > 0 {
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return p
}

func (p *subHoldingProxy) addr() string { return p.ln.Addr().String() }

// wait blocks a subscription's delivery while the proxy holds them.
func (p *subHoldingProxy) wait() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending++
	for p.hold {
		p.resume.Wait()
	}
	p.pending--
}

func (p *subHoldingProxy) holdSubs(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = on
	p.resume.Broadcast()
}

// held is how many reads from the server wait to be delivered.
func (p *subHoldingProxy) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending
}

// commands is how many writes clients sent on connections that are not
// subscriptions.
func (p *subHoldingProxy) commands() int64 { return p.sends.Load() }

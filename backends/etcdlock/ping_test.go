package etcdlock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

func TestPing(t *testing.T) {
	eps := endpoints(t)
	p := drivertest.StartProxy(t, eps[0])
	cut := newClient(t, []string{p.Addr()})
	p.Blackhole()
	up := newClient(t, eps)
	t.Run("Locker", func(t *testing.T) { drivertest.CheckPing(t, lockerOn(t, up), lockerOn(t, cut)) })
	t.Run("Store", func(t *testing.T) {
		s, err := NewStore(up)
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewStore(cut)
		if err != nil {
			t.Fatal(err)
		}
		drivertest.CheckPing(t, s, c)
	})
}

// TestPingMovesOn: a Locker pins one of its endpoints at random, and when
// the member pinned does not answer, Ping moves on to the next, as an
// acquisition does: a Locker listing the live server and an address nothing
// listens on, in either order, answers every Ping.
func TestPingMovesOn(t *testing.T) {
	live, dead := endpoints(t)[0], closedAddr(t)
	for _, eps := range [][]string{{live, dead}, {dead, live}} {
		for range 8 {
			l := lockerOn(t, newClient(t, eps))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			for range 3 {
				if err := l.Ping(ctx); err != nil {
					t.Errorf("Ping of a Locker on %v: %v", eps, err)
				}
			}
			cancel()
			l.Close()
		}
	}
}

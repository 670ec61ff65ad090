package redlock

import (
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestPing: Ping answers nil while a majority of the nodes answer (two of
// five cut off), and an error once a majority do not (three of five). The
// live Locker's nodes get more than the default 200ms: its first Ping dials
// every node through a proxy that dials in turn, which on a busy machine
// took longer, and it failed as if no node answered.
func TestPing(t *testing.T) {
	addrs := strings.Split(drivertest.Addr(t, addrsEnv, addrsDefault), ",")
	lockerWithDown := func(down int, opts ...Option) *Locker {
		proxied := make([]string, len(addrs))
		for i, a := range addrs {
			p := drivertest.StartProxy(t, a)
			if i < down {
				p.Blackhole()
			}
			proxied[i] = p.Addr()
		}
		l, err := New(clients(t, proxied, nil), opts...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	drivertest.CheckPing(t, lockerWithDown(2, WithNodeTimeout(5*time.Second)), lockerWithDown(3))
}

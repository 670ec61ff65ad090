package redlock

import (
	"strings"
	"testing"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestPing: Ping answers nil while a majority of the nodes answer (two of
// five cut off), and an error once a majority do not (three of five).
func TestPing(t *testing.T) {
	addrs := strings.Split(drivertest.Addr(t, addrsEnv, addrsDefault), ",")
	lockerWithDown := func(down int) *Locker {
		proxied := make([]string, len(addrs))
		for i, a := range addrs {
			p := drivertest.StartProxy(t, a)
			if i < down {
				p.Blackhole()
			}
			proxied[i] = p.Addr()
		}
		l, err := New(clients(t, proxied, nil))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	drivertest.CheckPing(t, lockerWithDown(2), lockerWithDown(3))
}

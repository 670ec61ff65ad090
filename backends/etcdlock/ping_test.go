package etcdlock

import (
	"testing"

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

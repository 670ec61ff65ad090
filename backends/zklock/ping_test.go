package zklock

import (
	"testing"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

func TestPing(t *testing.T) {
	srv := servers(t)
	p := drivertest.StartProxy(t, srv[0])
	cut := dial(t, []string{p.Addr()})
	p.Blackhole()
	drivertest.CheckPing(t, dial(t, srv), cut)
}

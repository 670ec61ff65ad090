package memory_test

import (
	"testing"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

func TestConformance(t *testing.T) {
	// One Locker is one process's lock table: every "client" of the suite
	// shares it, as goroutines of a single-process program would.
	shared := memory.New()
	drivertest.Run(t, drivertest.Backend{
		NewLocker: func(testing.TB) driver.Locker { return shared },
		TTL:       300 * time.Millisecond,
		FIFO:      true,
		Waiters:   func(_ testing.TB, key string) int { return shared.Waiters(key) },
	})
}

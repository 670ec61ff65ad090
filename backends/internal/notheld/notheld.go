// Package notheld words the error of a lease's renewal or release that the
// server refused, with why as far as the lock's state tells: its holder's
// section is cancelled with that error as the cause, and an operator's
// ForceRelease that read as an expiry would send whoever reads the log
// after a clock or a network fault that was not there. The backends that
// keep a lock's state past its holders (redislock, sqllock) read the reason
// from it; the text is the same on each.
package notheld

import (
	"fmt"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// Why is what the lock's state told of a lease no longer held.
type Why byte

const (
	// Unknown: the state tells none of the others (another format, an
	// earlier token, a read that failed).
	Unknown Why = iota
	// Forced: ForceRelease took this very lease (the state names its
	// token), and nobody took the lock since.
	Forced
	// Expired: the state is still this lease's, past its deadline.
	Expired
	// Later: a holder with a later token took the lock since; whether
	// the lease ran out or was taken away first, the state does not tell.
	Later
	// Released: the lease's own release freed it.
	Released
	// Gone: the lock's state is gone.
	Gone
)

// Error is ErrNotHeld saying why, then when ("" for a renewal, " before
// release" for a release). expiry is the lease's deadline by this
// process's clock, which is never after the server's: a later holder found
// before it took the lock from a lease that had not run out, by
// ForceRelease or by a loss of the server's.
func Error(why Why, expiry time.Time, when string) error {
	var s string
	switch why {
	case Forced:
		s = "released before it expired, by ForceRelease (an operator)"
	case Expired:
		s = "expired (nobody took it since)"
	case Later:
		s = "expired, and another holder took it (a later token)"
		if time.Now().Before(expiry) {
			s = "released before it expired (by ForceRelease, or lost by the server), and another holder took it (a later token)"
		}
	case Released:
		s = "released already"
	case Gone:
		s = "its state is gone (deleted, or lost by the server)"
	default:
		s = "expired or taken over"
	}
	return fmt.Errorf("%w: %s%s", driver.ErrNotHeld, s, when)
}

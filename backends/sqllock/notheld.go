package sqllock

import (
	"context"

	"github.com/warden-go/warden/backends/internal/notheld"
)

// notHeld is the error of each of leases, whose renewals or releases (when,
// see notheld.Error) the database refused, saying why as far as their rows
// tell, read in one more query on a path that failed already: a renewal or
// a release that succeeds costs none, nor does a lease this Locker released
// (lease.released), the one a batch renewal finds most often. A row keeps
// its owner and version when its lease runs out, and when it is released
// (lock_until back at locked_at); ForceRelease empties the owner and moves
// the version one past the holder's it removed; a grant writes its own
// owner and a later version. The rows may have changed since the refusal,
// which can make a reason vaguer (another grant hides ForceRelease's),
// never another lease's: only ForceRelease of this very lease leaves its
// version plus one with no owner. A failed read leaves the reason unknown.
func (l *Locker) notHeld(ctx context.Context, leases []*lease, when string) []error {
	var names []string
	for _, ls := range leases {
		if !ls.released.Load() {
			names = append(names, ls.key)
		}
	}
	var (
		rows map[string]whyRow
		err  error
	)
	if len(names) > 0 {
		rows, err = l.whyRows(ctx, names)
	}
	errs := make([]error, len(leases))
	for i, ls := range leases {
		why := notheld.Unknown
		r, found := rows[ls.key]
		switch {
		case ls.released.Load():
			why = notheld.Released
		case err != nil:
		case !found:
			why = notheld.Gone
		case r.owner == "" && r.version == ls.version+1:
			why = notheld.Forced
		case r.version > ls.version:
			why = notheld.Later
		case r.version != ls.version || r.owner != ls.owner():
		case r.released == 0:
			why = notheld.Released
		case r.remain <= 0:
			why = notheld.Expired
		}
		errs[i] = notheld.Error(why, ls.Expiry(), when)
	}
	return errs
}

// whyRow is what notHeld reads of a lock's row: its owner and version, and
// its lock_until less its locked_at (0 once released) and less the
// database's now (not above 0 once it ran out).
type whyRow struct {
	owner            string
	version          int64
	released, remain int64
}

// whyRows reads the rows of names for notHeld, by name.
func (l *Locker) whyRows(ctx context.Context, names []string) (map[string]whyRow, error) {
	res, err := l.db.WithContext(ctx).Raw("SELECT name, owner, version, lock_until - locked_at, lock_until - "+l.d.now+
		" FROM "+l.table+" WHERE name IN ?", names).Rows()
	if err != nil {
		return nil, err
	}
	defer res.Close()
	rows := make(map[string]whyRow, len(names))
	for res.Next() {
		var (
			name string
			r    whyRow
		)
		if err := res.Scan(&name, &r.owner, &r.version, &r.released, &r.remain); err != nil {
			return nil, err
		}
		rows[name] = r
	}
	return rows, res.Err()
}

// notHeld is Locker.notHeld of ls alone.
func (ls *lease) notHeld(ctx context.Context, when string) error {
	return ls.l.notHeld(ctx, []*lease{ls}, when)[0]
}

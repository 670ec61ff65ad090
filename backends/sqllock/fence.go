package sqllock

import (
	"errors"
	"fmt"
	"math"

	"gorm.io/gorm"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard/driver"
)

// ErrStaleToken is returned by Fence when a newer token has already written
// the resource. The error also wraps driver.ErrLockLost: the caller's lock was
// lost, and its transaction must be rolled back. It is fence.ErrStaleToken,
// the sentinel of every engine's fenced writes.
var ErrStaleToken = fence.ErrStaleToken

// Fence guards the caller's own writes with a lease's fencing token. Call it
// inside the transaction tx, before the writes to resource, with the token
// of the lease under which they are made (Lease.Token). It records token as
// the resource's highest in the fence table (DefaultFenceTable, created by
// Locker.Migrate) and returns an error wrapping ErrStaleToken when a higher
// token is already recorded there; then roll tx back.
//
// The fence row stays locked by tx until it ends, so of a stale holder that
// woke up late and the holder that replaced it, whichever fences second waits
// for the first to commit and then sees its token: the stale writes are
// either refused or, if they came first, overwritten, never the reverse. The
// same token may fence many transactions. tx must be a transaction
// (db.Transaction or db.Begin); Fence refuses anything else with
// driver.ErrInvalidOption, since the check would not cover the writes, and
// a dry-run session too, where it would check nothing. A resource is a key
// as the lock table takes it (valid UTF-8, at most 255 bytes), without a
// NUL byte; anything else is refused with driver.ErrInvalidKey.
func Fence(tx *gorm.DB, resource string, token uint64) error {
	if tx == nil {
		return fmt.Errorf("%w: nil transaction", driver.ErrInvalidOption)
	}
	if _, ok := tx.Statement.ConnPool.(gorm.TxCommitter); !ok {
		return fmt.Errorf("%w: Fence needs a transaction, got a plain *gorm.DB", driver.ErrInvalidOption)
	}
	if tx.DryRun {
		return fmt.Errorf("%w: Fence in a dry-run session, whose statements do not run, cannot check the token", driver.ErrInvalidOption)
	}
	if err := checkKey(resource); err != nil {
		return err
	}
	if token == 0 || token > math.MaxInt64 {
		return fmt.Errorf("%w: token %d", driver.ErrInvalidOption, token)
	}
	d, err := dialectOf(tx)
	if err != nil {
		return err
	}
	table, err := quoteTable(tx, DefaultFenceTable)
	if err != nil {
		return err
	}
	ctx := tx.Statement.Context
	tx = tx.Session(&gorm.Session{NewDB: true})
	tok := int64(token)
	if d.upsert {
		// The WHERE of ON CONFLICT is checked against the row's latest
		// version once its lock is held, so a concurrent higher token is
		// seen, not missed.
		res := tx.Exec("INSERT INTO "+table+" AS f (resource, token) VALUES (?, ?) ON CONFLICT (resource)"+
			" DO UPDATE SET token = excluded.token WHERE f.token <= excluded.token", resource, tok)
		if res.Error != nil {
			return unavailable(ctx, fmt.Errorf("fence %q: %w", resource, res.Error))
		}
		if res.RowsAffected == 0 {
			return fence.Stale(fence.Claim{Resource: resource, Token: token}, 0)
		}
		return nil
	}
	// MySQL cannot filter ON DUPLICATE KEY UPDATE nor tell "unchanged" from
	// "refused" by its row count, so keep the higher token and read back,
	// with a locking read that sees the latest row rather than the
	// transaction's snapshot.
	if err := tx.Exec("INSERT INTO "+table+" (resource, token) VALUES (?, ?)"+
		" ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))", resource, tok).Error; err != nil {
		return unavailable(ctx, fmt.Errorf("fence %q: %w", resource, err))
	}
	// Scan, not Row: Row returns a nil *sql.Row when a callback failed.
	var current int64
	res := tx.Raw("SELECT token FROM "+table+" WHERE resource = ? FOR UPDATE", resource).Scan(&current)
	err = res.Error
	if err == nil && res.RowsAffected == 0 {
		err = errors.New("fence row vanished")
	}
	if err != nil {
		return unavailable(ctx, fmt.Errorf("fence %q: %w", resource, err))
	}
	if current != tok {
		return fence.Stale(fence.Claim{Resource: resource, Token: token}, uint64(current))
	}
	return nil
}

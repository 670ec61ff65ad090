package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/scheduler"
)

// Order states.
const (
	statusUnpaid = "unpaid"
	statusPaid   = "paid"
	statusClosed = "closed"
)

// fenceResource names what the close job's fenced writes protect: every
// close goes through one fence row, so a paused stale holder's close is
// refused once a newer run has written.
const fenceResource = "closeorder/orders"

// Order is a row of the orders table and its JSON form.
type Order struct {
	ID          int64      `gorm:"primaryKey;autoIncrement" json:"id"`
	UserID      string     `gorm:"size:128;not null;index" json:"user_id"`
	AmountCents int64      `gorm:"not null" json:"amount_cents"`
	Status      string     `gorm:"size:16;not null;index" json:"status"`
	CreatedAt   time.Time  `gorm:"not null;index" json:"created_at"`
	PaidAt      *time.Time `json:"paid_at"`
	ClosedAt    *time.Time `json:"closed_at"`
	ClosedBy    *string    `gorm:"size:128" json:"closed_by"`
	ClosedToken *uint64    `json:"closed_token"`
}

// JobRun is a row of the job_runs table: one run of a scheduled job.
type JobRun struct {
	ID         int64      `gorm:"primaryKey;autoIncrement" json:"-"`
	Job        string     `gorm:"size:128;not null;index" json:"job"`
	Slot       time.Time  `gorm:"not null" json:"slot"`
	Instance   string     `gorm:"size:128;not null" json:"instance"`
	Token      uint64     `json:"token"`
	StartedAt  time.Time  `gorm:"not null;index" json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Outcome    string     `gorm:"size:16;not null" json:"outcome"`
	Closed     int        `json:"closed"`
	// StaleRejected is set when the run's fenced write was refused because
	// a newer holder had written: the run had lost its lock.
	StaleRejected bool `json:"stale_rejected"`
}

var (
	errNotFound     = errors.New("order not found")
	errOrderClosed  = errors.New("order is closed")
	errStaleHolder  = errors.New("the close job's lock was taken over: its writes are refused")
	errInvalidInput = errors.New("invalid input")
)

// orders is the orders database.
type orders struct {
	db *gorm.DB
}

// migrate creates the orders and job_runs tables, and the fence table the
// close job's writes go through (it lives with the data it protects,
// whichever backend holds the lock).
func (o *orders) migrate(ctx context.Context) error {
	if err := o.db.WithContext(ctx).AutoMigrate(&Order{}, &JobRun{}); err != nil {
		return err
	}
	fence, err := sqllock.New(o.db)
	if err != nil {
		return err
	}
	return fence.Migrate(ctx)
}

func now() time.Time { return time.Now().UTC() }

func (o *orders) create(ctx context.Context, userID string, amount int64) (*Order, error) {
	if amount <= 0 {
		return nil, fmt.Errorf("%w: amount_cents must be positive, got %d", errInvalidInput, amount)
	}
	ord := &Order{UserID: userID, AmountCents: amount, Status: statusUnpaid, CreatedAt: now()}
	if err := o.db.WithContext(ctx).Create(ord).Error; err != nil {
		return nil, err
	}
	return ord, nil
}

func (o *orders) get(ctx context.Context, userID string, id int64) (*Order, error) {
	var ord Order
	err := o.db.WithContext(ctx).Where("user_id = ?", userID).First(&ord, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, errNotFound
	}
	return &ord, err
}

func (o *orders) list(ctx context.Context, userID, status string) ([]Order, error) {
	q := o.db.WithContext(ctx).Where("user_id = ?", userID).Order("id")
	if status != "" {
		q = q.Where("status = ?", status)
	}
	var out []Order
	return out, q.Find(&out).Error
}

// pay marks the caller's unpaid order paid. The WHERE status = 'unpaid' makes
// payment and the close job exclusive per order without a lock: whichever
// commits first wins, and the other changes no row.
func (o *orders) pay(ctx context.Context, userID string, id int64) (*Order, error) {
	var ord *Order
	err := o.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&Order{}).Where("id = ? AND user_id = ? AND status = ?", id, userID, statusUnpaid).
			Updates(map[string]any{"status": statusPaid, "paid_at": now()})
		if res.Error != nil {
			return res.Error
		}
		var cur Order
		if err := tx.First(&cur, id).Error; err != nil {
			if errors.Is(err, gorm.ErrRecordNotFound) {
				return errNotFound
			}
			return err
		}
		switch {
		case cur.UserID != userID:
			return errNotFound // another user's order is not revealed
		case cur.Status == statusClosed:
			return errOrderClosed
		}
		ord = &cur
		return nil
	})
	return ord, err
}

// closeExpired closes the unpaid orders created before cutoff, each in its
// own transaction fenced by token, and returns how many it closed. pause is
// slept before each close (demos and fault tests). It stops at the first
// refused fence: the run's lock has been taken over.
func (o *orders) closeExpired(ctx context.Context, cutoff time.Time, instance string, token uint64, pause time.Duration) (int, error) {
	var ids []int64
	if err := o.db.WithContext(ctx).Model(&Order{}).Where("status = ? AND created_at < ?", statusUnpaid, cutoff).
		Order("id").Pluck("id", &ids).Error; err != nil {
		return 0, err
	}
	closed := 0
	for _, id := range ids {
		if pause > 0 {
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return closed, context.Cause(ctx)
			}
		}
		var changed bool
		err := o.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := sqllock.Fence(tx, fenceResource, token); err != nil {
				return err
			}
			// closed_at is read inside the transaction, after the fence:
			// a payment that committed first leaves no unpaid row to close.
			res := tx.Model(&Order{}).Where("id = ? AND status = ?", id, statusUnpaid).
				Updates(map[string]any{"status": statusClosed, "closed_at": now(), "closed_by": instance, "closed_token": token})
			changed = res.RowsAffected == 1
			return res.Error
		})
		if errors.Is(err, sqllock.ErrStaleToken) {
			return closed, fmt.Errorf("%w: %w", errStaleHolder, err)
		}
		if err != nil {
			return closed, err
		}
		if changed {
			closed++
		}
	}
	return closed, nil
}

// startRun records a run as it starts; finishRun completes the record.
func (o *orders) startRun(ctx context.Context, job string, slot time.Time, instance string, token uint64) error {
	return o.db.WithContext(ctx).Create(&JobRun{
		Job: job, Slot: slot.UTC(), Instance: instance, Token: token, StartedAt: now(), Outcome: "running",
	}).Error
}

func (o *orders) setClosed(job string, slot time.Time, instance string, closed int, stale bool) error {
	// Not the job's ctx: the count is recorded even when the run was cut short.
	return o.db.Model(&JobRun{}).Where("job = ? AND slot = ? AND instance = ?", job, slot.UTC(), instance).
		Updates(map[string]any{"closed": closed, "stale_rejected": stale}).Error
}

// finishRun records the outcome of a run: it completes the record its job
// started, or adds one for a run that never started (skipped, misfired).
func (o *orders) finishRun(r scheduler.RunRecord) error {
	finished := r.Finished.UTC()
	res := o.db.Model(&JobRun{}).Where("job = ? AND slot = ? AND instance = ? AND finished_at IS NULL", r.Job, r.Slot.UTC(), r.Instance).
		Updates(map[string]any{"finished_at": finished, "outcome": string(r.Outcome)})
	if res.Error != nil || res.RowsAffected > 0 {
		return res.Error
	}
	return o.db.Create(&JobRun{
		Job: r.Job, Slot: r.Slot.UTC(), Instance: r.Instance, Token: r.Token,
		StartedAt: r.Started.UTC(), FinishedAt: &finished, Outcome: string(r.Outcome),
	}).Error
}

func (o *orders) runs(ctx context.Context, limit int) ([]JobRun, error) {
	var out []JobRun
	return out, o.db.WithContext(ctx).Order("started_at DESC, id DESC").Limit(limit).Find(&out).Error
}

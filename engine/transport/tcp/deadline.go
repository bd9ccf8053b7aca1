package tcp

import (
	"errors"
	"net"
	"os"
	"time"
)

// deadline keeps one direction (read or write) of a connection's deadline,
// moving it as seldom as it can. Each move of a net.Conn deadline re-arms a
// runtime timer, and arming one may wake an idle thread of the scheduler so
// that the network poller sleeps no longer than the new timer: once per
// request, on a host with few cores, that thread runs beside the transfer it
// is meant to bound. Served READs of 1 MiB took twice as long on two cores.
//
// So the armed deadline stays while it falls no later than the one wanted
// and no sooner than halfway to it: with requests of equal timeouts it moves
// about twice per timeout. An I/O that times out on the armed deadline before
// its own has passed is resumed by the caller, after resume re-armed the
// deadline it wants: nothing of the stream is lost to a timeout.
type deadline struct {
	set func(time.Time) error // conn.SetReadDeadline or conn.SetWriteDeadline
	at  time.Time             // armed; zero when none
}

// arm makes sure the next I/O fails no later than want.
func (d *deadline) arm(want time.Time) {
	if !d.at.IsZero() && !d.at.After(want) {
		now := time.Now()
		if d.at.Sub(now) >= want.Sub(now)/2 {
			return
		}
	}
	d.put(want)
}

// clear lets the next I/O wait for ever (an idle connection between requests).
func (d *deadline) clear() {
	if !d.at.IsZero() {
		d.put(time.Time{})
	}
}

// resume reports whether an I/O that failed with err only hit the armed
// deadline before want: then it re-arms want, and the I/O may go on where it
// stopped.
func (d *deadline) resume(err error, want time.Time) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(want) {
		return false
	}
	d.put(want)
	return true
}

func (d *deadline) put(t time.Time) {
	d.at = t
	d.set(t)
}

// timedOut reports whether err is a deadline passing rather than a failure of
// the connection.
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mooncake-go/mooncake/internal/freeport"
)

// proc is a child process of a yardstick: a server, or a Python driver
// that talks JSON lines on its stdin and stdout.
type proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser // nil for a server, which is stopped by signal
	stop  os.Signal      // what stops a server; zero: SIGTERM
	lines chan []byte    // stdout lines; closed at EOF
	log   *tail          // its stderr, and its stdout when lines is nil
	quit  chan struct{}  // closed by Close: lines are then dropped
	done  chan struct{}  // closed once Wait returned
	err   error          // Wait's, valid once done is closed
	once  sync.Once
}

// startProc starts path with args and env added to ours. With talk, the
// child's stdout comes back as lines and its stdin stays open until Close;
// otherwise both go to the log.
func startProc(name, path string, args, env []string, talk bool) (*proc, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	// Should we die without closing it, the kernel kills the child. (Pdeathsig
	// follows the thread that started it, which the Go runtime never ends
	// unless it was locked; nothing here locks one.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &proc{name: name, cmd: cmd, log: &tail{}, quit: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = p.log
	var stdout io.ReadCloser
	if talk {
		var err error
		if p.stdin, err = cmd.StdinPipe(); err != nil {
			return nil, err
		}
		if stdout, err = cmd.StdoutPipe(); err != nil {
			return nil, err
		}
		p.lines = make(chan []byte, 4)
	} else {
		cmd.Stdout = p.log
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("store: start %s: %w", name, err)
	}
	var reading sync.WaitGroup
	if talk {
		reading.Go(func() {
			defer close(p.lines)
			s := bufio.NewScanner(stdout)
			s.Buffer(nil, 1<<20)
			for s.Scan() {
				select {
				case p.lines <- bytes.Clone(s.Bytes()):
				case <-p.quit:
				}
			}
			io.Copy(io.Discard, stdout) // after an overlong line
		})
	}
	go func() {
		// Wait closes stdout, so it waits for the reader to reach EOF.
		reading.Wait()
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// pid is the child's process id.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the child has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// recv reads the child's next line into v. A line {"error": ...}, the end of
// its output, timeout and ctx end the wait with an error that quotes its
// stderr.
func (p *proc) recv(ctx context.Context, timeout time.Duration, v any) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case b, ok := <-p.lines:
		if !ok {
			<-p.done
			return p.fail(fmt.Errorf("exited (%v)", p.err))
		}
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return p.fail(errors.New(e.Error))
		}
		if err := json.Unmarshal(b, v); err != nil {
			return p.fail(fmt.Errorf("bad line %q: %w", b, err))
		}
		return nil
	case <-t.C:
		return p.fail(fmt.Errorf("no answer in %v", timeout))
	case <-ctx.Done():
		return ctx.Err()
	}
}

// send writes one line to the child.
func (p *proc) send(line string) error {
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		return p.fail(err)
	}
	return nil
}

// fail wraps err with the child's name and the end of its stderr.
func (p *proc) fail(err error) error {
	return fmt.Errorf("store: %s (pid %d): %w; its log ends:\n%s", p.name, p.pid(), err, p.log)
}

// Close stops the child and waits for it: closing its stdin ends a driver,
// a signal (stop) a server; SIGKILL follows if it lingers. It is idempotent and
// reports only a failure to stop, not the exit status.
func (p *proc) Close() error {
	p.once.Do(func() {
		close(p.quit)
		switch {
		case p.stdin != nil:
			p.stdin.Close()
		case p.stop != nil:
			p.cmd.Process.Signal(p.stop)
		default:
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
		t := time.NewTimer(10 * time.Second)
		defer t.Stop()
		select {
		case <-p.done:
			return
		case <-t.C:
		}
		p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	})
	return nil
}

// tail keeps the last tailSize bytes written to it, for error reports.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailSize = 4 << 10

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - tailSize; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// freePorts returns n TCP ports free a moment ago, for servers that must be
// told their port, outside the kernel's ephemeral range (package
// freeport). Another process may take one in between; the server then
// fails to start and says so.
func freePorts(n int) ([]int, error) {
	ports, err := freeport.Pick(n)
	if err != nil {
		return nil, fmt.Errorf("store: free port: %w", err)
	}
	return ports, nil
}

// waitTCP waits until addr accepts connections, the child exits, ctx ends
// or timeout passes.
func waitTCP(ctx context.Context, p *proc, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.exited() {
			return p.fail(fmt.Errorf("exited (%v) before listening on %s", p.err, addr))
		}
		if time.Now().After(deadline) {
			return p.fail(fmt.Errorf("not listening on %s after %v", addr, timeout))
		}
		// Polling, for want of a readiness signal from the server; a
		// refused dial is immediate, so this is the only pause.
		select {
		case <-time.After(20 * time.Millisecond):
		case <-p.done:
		case <-ctx.Done():
		}
	}
}

package te

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Launcher starts the passive sides of the benchmark: the target engine and
// the loopback TCP sink of the yardstick. Each returns what the initiator
// needs to reach it and a Closer that stops it and waits until it is gone.
type Launcher interface {
	StartTarget(ctx context.Context, cfg TargetConfig) (TargetInfo, io.Closer, error)
	StartSink(ctx context.Context, cfg SinkConfig) (SinkInfo, io.Closer, error)
}

var (
	_ Launcher = InProcess{}
	_ Launcher = Exec{}
)

// InProcess runs the target and the sink in this process. It is quick to
// start and the easiest to debug, but both sides then share one Go runtime
// and its scheduler, which a real deployment never does.
type InProcess struct {
	// Logger is the target engine's logger. Zero: slog.Default().
	Logger *slog.Logger
}

// StartTarget implements Launcher.
func (l InProcess) StartTarget(ctx context.Context, cfg TargetConfig) (TargetInfo, io.Closer, error) {
	if cfg.Logger == nil {
		cfg.Logger = l.Logger
	}
	t, err := NewTarget(ctx, cfg)
	if err != nil {
		return TargetInfo{}, nil, err
	}
	return t.Info(), t, nil
}

// StartSink implements Launcher.
func (InProcess) StartSink(_ context.Context, cfg SinkConfig) (SinkInfo, io.Closer, error) {
	s, err := NewSink(cfg)
	if err != nil {
		return SinkInfo{}, nil, err
	}
	return s.Info(), s, nil
}

// Exec runs the target and the sink as child processes of a binary whose
// hidden commands call ServeTarget and ServeSink (mooncake's are
// "bench te target" and "bench te tcp-sink"). A child prints one JSON line
// on stdout once it is ready and lives until its stdin closes, so it also
// ends when this process dies, however it dies.
type Exec struct {
	// Path is the binary, usually os.Executable().
	Path string
	// Target and Sink are the arguments that select the hidden commands;
	// the configs' Args follow them.
	Target, Sink []string
	// Args go after the configs' (a log level, say).
	Args []string
	// Stderr receives the children's stderr. Zero: os.Stderr.
	Stderr io.Writer
	// StartTimeout bounds a child's start. Zero: 30 s.
	StartTimeout time.Duration
}

// StartTarget implements Launcher.
func (x Exec) StartTarget(ctx context.Context, cfg TargetConfig) (TargetInfo, io.Closer, error) {
	var info TargetInfo
	c, err := x.start(ctx, append(append(append([]string{}, x.Target...), cfg.Args()...), x.Args...), &info)
	if err == nil && info.Segment == "" {
		err = errors.Join(errors.New("te: target child announced no segment"), c.Close())
	}
	if err != nil {
		return TargetInfo{}, nil, err
	}
	return info, c, nil
}

// StartSink implements Launcher.
func (x Exec) StartSink(ctx context.Context, cfg SinkConfig) (SinkInfo, io.Closer, error) {
	var info SinkInfo
	c, err := x.start(ctx, append(append(append([]string{}, x.Sink...), cfg.Args()...), x.Args...), &info)
	if err == nil && info.Addr == "" {
		err = errors.Join(errors.New("te: sink child announced no address"), c.Close())
	}
	if err != nil {
		return SinkInfo{}, nil, err
	}
	return info, c, nil
}

// child is a started child process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.Closer
	stdout io.Closer
	done   chan struct{} // closed once Wait returned
	err    error
}

func (x Exec) start(ctx context.Context, args []string, hello any) (*child, error) {
	cmd := exec.Command(x.Path, args...)
	cmd.Stderr = x.Stderr
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	// Our own pipes rather than StdinPipe/StdoutPipe: Wait must not close
	// the read end under the goroutine that reads the announcement.
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout = inR, outW
	err = cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("te: start %s: %w", x.Path, err)
	}
	c := &child{cmd: cmd, stdin: inW, stdout: outR, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	line := make(chan []byte, 1)
	go func() {
		b, _ := bufio.NewReader(outR).ReadBytes('\n')
		line <- b
	}()
	timeout := x.StartTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	var b []byte
	select {
	case b = <-line:
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), c.Close())
	case <-t.C:
		return nil, errors.Join(fmt.Errorf("te: %s %v: not ready after %v", x.Path, args, timeout), c.Close())
	}
	if err := json.Unmarshal(b, hello); err != nil {
		// Most likely the child failed and said why on stderr.
		return nil, errors.Join(fmt.Errorf("te: %s %v: no announcement (%q)", x.Path, args, b), c.Close())
	}
	return c, nil
}

// Close asks the child to stop by closing its stdin, then signals it, then
// kills it, and always waits for it.
func (c *child) Close() error {
	c.stdin.Close()
	defer c.stdout.Close()
	for _, step := range []struct {
		grace time.Duration
		sig   os.Signal
	}{{10 * time.Second, syscall.SIGTERM}, {2 * time.Second, syscall.SIGKILL}} {
		t := time.NewTimer(step.grace)
		select {
		case <-c.done:
			t.Stop()
			return c.exitErr()
		case <-t.C:
			c.cmd.Process.Signal(step.sig)
		}
	}
	<-c.done
	return c.exitErr()
}

func (c *child) exitErr() error {
	if c.err != nil {
		return fmt.Errorf("te: child %d (%s): %w", c.cmd.Process.Pid, c.cmd.Path, c.err)
	}
	return nil
}

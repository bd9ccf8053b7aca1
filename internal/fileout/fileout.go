// Package fileout writes result files (Parquet, PNG, CSV) through a
// buffer, reporting the first error of writing, flushing or closing.
package fileout

import (
	"bufio"
	"os"
)

// Write creates (or truncates) the file at path and hands write a 1 MiB
// buffered writer over it; the buffer is flushed and the file closed
// after it.
func Write(path string, write func(w *bufio.Writer) error) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	if err := write(w); err != nil {
		return err
	}
	return w.Flush()
}

//go:build !unix

package main

import "os"

// termWidth is 80: the width of a terminal is read on Unix only.
func termWidth(*os.File) int { return 80 }

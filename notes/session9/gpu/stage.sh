#!/bin/bash
# On the lent GPU machine: moves the pieces this call carried (.devstage/*)
# out of the checkout, to /tmp/stage, which stays while the machine is warm.
mkdir -p /tmp/stage && mv .devstage/* /tmp/stage/ && ls /tmp/stage | tr '\n' ' ' && du -sh /tmp/stage

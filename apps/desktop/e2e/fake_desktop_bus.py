#!/usr/bin/python3
"""Fake desktop services on the session bus: the notification server and the
file manager.

Owns org.freedesktop.Notifications and answers the Desktop Notifications
Specification's methods (Notify, GetCapabilities, GetServerInformation,
CloseNotification) at /org/freedesktop/Notifications, with org.lemon.E2E.Press
to press a notification's button (the ActionInvoked signal), and owns
org.freedesktop.FileManager1 and answers ShowItems at
/org/freedesktop/FileManager1. Every Notify, CloseNotification and ShowItems call is printed to
stdout as one JSON line ({"call": "Notify", "summary", "body", ...} or
{"call": "ShowItems", "uris"}); "ready" is printed once both names are owned.
Needs Debian's python3-dbus and python3-gi (the system Python: /usr/bin/python3).
"""

import json
import sys

import dbus
import dbus.mainloop.glib
import dbus.service
from gi.repository import GLib

NAME = "org.freedesktop.Notifications"
PATH = "/org/freedesktop/Notifications"
# The test's own method: press a notification's button (org.lemon.E2E.Press).
TEST = "org.lemon.E2E"
FILE_MANAGER = "org.freedesktop.FileManager1"
FILE_MANAGER_PATH = "/org/freedesktop/FileManager1"


class Notifications(dbus.service.Object):
    def __init__(self, bus):
        super().__init__(bus, PATH)
        self.last_id = 0

    @dbus.service.method(NAME, in_signature="susssasa{sv}i", out_signature="u")
    def Notify(self, app_name, replaces_id, app_icon, summary, body, actions, hints, expire_timeout):
        self.last_id += 1
        print(json.dumps({
            "call": "Notify",
            "id": self.last_id,
            "app_name": str(app_name),
            "summary": str(summary),
            "body": str(body),
            "actions": [str(a) for a in actions],
        }), flush=True)
        return dbus.UInt32(self.last_id)

    @dbus.service.method(NAME, in_signature="", out_signature="as")
    def GetCapabilities(self):
        return ["body", "actions"]

    @dbus.service.method(NAME, in_signature="", out_signature="ssss")
    def GetServerInformation(self):
        return ("lemon-e2e-notifications", "lemon", "1.0", "1.2")

    @dbus.service.method(NAME, in_signature="u", out_signature="")
    def CloseNotification(self, notification_id):
        print(json.dumps({"call": "CloseNotification", "id": int(notification_id)}), flush=True)
        self.NotificationClosed(notification_id, dbus.UInt32(3))

    @dbus.service.signal(NAME, signature="uu")
    def NotificationClosed(self, notification_id, reason):
        pass

    @dbus.service.signal(NAME, signature="us")
    def ActionInvoked(self, notification_id, action_key):
        pass

    @dbus.service.method(TEST, in_signature="us", out_signature="")
    def Press(self, notification_id, action_key):
        """What a person's click on a notification's button does: the
        server's ActionInvoked signal, then the notification closes."""
        self.ActionInvoked(notification_id, action_key)
        self.NotificationClosed(notification_id, dbus.UInt32(2))


class FileManager(dbus.service.Object):
    def __init__(self, bus):
        super().__init__(bus, FILE_MANAGER_PATH)

    @dbus.service.method(FILE_MANAGER, in_signature="ass", out_signature="")
    def ShowItems(self, uris, startup_id):
        print(json.dumps({"call": "ShowItems", "uris": [str(u) for u in uris]}), flush=True)


def main():
    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    bus = dbus.SessionBus()
    names = [dbus.service.BusName(n, bus, do_not_queue=True) for n in (NAME, FILE_MANAGER)]
    services = [Notifications(bus), FileManager(bus)]
    print("ready", flush=True)
    try:
        GLib.MainLoop().run()
    except KeyboardInterrupt:
        pass
    del services, names
    return 0


if __name__ == "__main__":
    sys.exit(main())
